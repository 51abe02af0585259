"""Write notebooks/plan.ipynb from the cells below (outputs stripped, so its source is
reviewable): `python notebooks/build_plan_notebook.py`. `SIMSERVE_NOTEBOOK_FAST=1` (set by
the tests) makes it simulate fewer requests."""
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).parent

CELLS = [
    ("md", ("# What if? The same traffic on 4090s + a Xeon, on H20s, on H100s\n\n"
           "`simserve.plan` prices every candidate deployment, screens them analytically, "
           "simulates the most promising with capacity bisection and ranks them. Here: "
           "Llama-3.1-8B, DualPace's conversation workload, a TTFT target of 5 s and a 200 ms "
           "per-token deadline; an RTX 4090 with a Xeon Silver 4510 host (DualPace decodes on "
           "its CPU too), one or two H20s, one or two H100s. Prices are the shipped on-demand "
           "table (`simserve/data/prices/on-demand-2026.yaml`; the H20's is an assumption "
           "there, override it with a quote).")),
    ("code", """import os
import simserve.plan as sp
FAST = os.environ.get("SIMSERVE_NOTEBOOK_FAST") == "1"
N = 240 if FAST else 1200          # requests per simulated point (the last rung)"""),
    ("code", """PLAN = {
    "name": "what-if-hardware", "model": "llama-3.1-8b",
    "workload": {"trace": "synthetic-dualpace-conversation", "num_requests": N,
                 "rate": "maximise"},
    "slo": {"ttft_ms": 5000, "tbt_ms": 200, "attainment": 0.9},
    "hardware": [
        {"gpu": "rtx4090", "num_gpus": [1], "cpu": "xeon-silver-4510", "cpu_cores": [12],
         "host_memory_gib": 256},
        {"gpu": "h20", "num_gpus": [1, 2]},
        {"gpu": "h100-sxm", "num_gpus": [1, 2]},
    ],
    "designs": [{"policy": "dualpace", "host_kv_gib": [60, 120]},
                {"policy": "vllm", "max_num_batched_tokens": [2048, 8192]}],
    "objective": "goodput_per_dollar",
    "search": {"frontier": 1, "seeds": [0], "rtol": 0.1},
}
res = sp.plan(sp.parse_plan(PLAN), workers=1)
print(res.summary())
print(res.table(8))"""),
    ("md", ("Each simulated row says how it was simulated; `halted` rows stopped at the first "
           "(shorter) rung, and `≥` marks a rate the request list was too short to push past. "
           "The screen's error column says how far the analytical ranking can be trusted for "
           "this workload.")),
    ("code", """fig = res.plot()"""),
    ("md", "## Per hardware: the best row of each GPU kind, per dollar"),
    ("code", """df = res.frame()
sim = df[df["rate"].notna()].copy()
sim["req_s_per_usd_h"] = sim["rate"] / sim["usd_per_hour"]
best = sim.sort_values("req_s_per_usd_h", ascending=False).groupby("gpu").head(1)
best[["config", "usd_per_hour", "sustained", "req_s_per_usd_h", "usd_per_mtok",
      "tok_s_per_gpu", "tok_s_per_user", "status"]]"""),
    ("md", "## The winner, as an experiment `simserve run` reproduces"),
    ("code", """print(res.winner_yaml())
print(res.vllm_flags() or "(not a vLLM design: no vllm serve flags)")"""),
]


def main() -> None:
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src)
                for kind, src in CELLS]
    nbf.write(nb, HERE / "plan.ipynb")


if __name__ == "__main__":
    main()
