"""Write the notebooks from the cells below (outputs stripped), so their source is reviewable.

    python notebooks/build_notebooks.py

`SIMSERVE_NOTEBOOK_FAST=1` (set by the tests) makes them simulate fewer requests.
"""
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).parent

SETUP = """import os
import matplotlib.pyplot as plt
import pandas as pd
import simserve
FAST = os.environ.get("SIMSERVE_NOTEBOOK_FAST") == "1"
N = 150 if FAST else 2000          # requests per simulated point
RATES = [4, 12, 20] if FAST else [2, 4, 8, 12, 16, 20, 24]"""

WHAT_IF = [
    ("md", "# What if? Serving designs and hardware, side by side\n\n"
           "Every cell uses the public API (`simserve.simulate`, `simserve.run_experiment`). "
           "Set `SIMSERVE_NOTEBOOK_FAST=1` for a quick run. The questions below compare the "
           "single-GPU batching policies; the CPU-offloading designs (NEO, DualPace: a host "
           "CPU beside the GPU) and the multi-GPU ones (ConfluxServe and its baselines "
           "LoongServe, MuxWise, DistServe) are policies too, named the same way in "
           "`policies:` (`simserve policies` lists every one and its options; "
           "`docs/reproductions/` runs them on the papers' deployments). "
           "`pip install 'simserve[notebooks]'` brings JupyterLab and ipywidgets, which draw "
           "the progress bars of long points."),
    ("code", SETUP),
    ("md", "## Which batching policy wins for this trace and SLO?\n\n"
           "vLLM V1 chunked prefill with two token budgets against Sarathi-Serve on "
           "Llama-3.1-8B / 1x H100, a conversation workload, TTFT SLO 2 s and TBT SLO 100 ms."),
    ("code", """exp = {
    "name": "what-if-policies", "model": "llama-3.1-8b",
    "hardware": {"gpu": "h100-sxm"},
    "workload": {"trace": "synthetic-conversation", "num_requests": N, "arrival": "poisson",
                 "rates": RATES, "seed": 0},
    "policies": [{"name": "vllm", "label": "vllm-2048", "max_num_batched_tokens": 2048},
                 {"name": "vllm", "label": "vllm-8192", "max_num_batched_tokens": 8192},
                 {"name": "sarathi", "label": "sarathi-512", "max_num_batched_tokens": 512}],
    "slo": {"ttft_ms": 2000, "tbt_ms": 100},
}
df = simserve.run_experiment(exp)
df[["policy", "request_rate", "p99_ttft_ms", "p99_itl_ms", "mean_normalized_latency_s", "slo_attainment"]]"""),
    ("code", """fig, axs = plt.subplots(1, 2, figsize=(11, 4))
for pol, g in df.groupby("policy"):
    axs[0].plot(g.request_rate, g.p99_itl_ms, "o-", label=pol)
    axs[1].plot(g.request_rate, 100 * g.slo_attainment, "o-", label=pol)
axs[0].set(xlabel="request rate (req/s)", ylabel="P99 inter-token latency (ms)", yscale="log")
axs[1].axhline(95, color="k", ls=":", lw=1)
axs[1].set(xlabel="request rate (req/s)", ylabel="requests meeting every token deadline (%)")
for ax in axs:
    ax.grid(alpha=0.3); ax.legend()
plt.tight_layout()"""),
    ("code", """from simserve.metrics import max_rate_meeting
goodput = {pol: max_rate_meeting(g.request_rate, g.slo_attainment, 0.95)
           for pol, g in df.groupby("policy")}
pd.DataFrame(goodput, index=["goodput (req/s)", "censored"]).T"""),
    ("md", "## What does a different GPU buy?\n\n"
           "The same vLLM configuration on the measured H200, and on the H100 and H20 profiles "
           "derived from it by datasheet ratios (see `hwprofiles/README.md`)."),
    ("code", """rows = []
for gpu in ["h200-sxm", "h100-sxm", "h20"]:
    for rate in RATES:
        r = simserve.simulate("vllm", gpu=gpu, rate=rate, num_requests=N,
                                             max_num_batched_tokens=2048,
                                             slo={"ttft_ms": 2000, "tbt_ms": 100})
        rows.append({"gpu": gpu, "rate": rate, **{k: r.summary[k] for k in
                     ("mean_tpot_ms", "p99_ttft_ms", "slo_attainment")}})
hw = pd.DataFrame(rows)
hw.pivot(index="rate", columns="gpu", values="mean_tpot_ms").round(1)"""),
    ("md", "## Where does the time go in one run?\n\n"
           "Per-request records and the engine's time series of one point."),
    ("code", """r = simserve.simulate("vllm", rate=RATES[-1], num_requests=N, max_num_batched_tokens=2048)
ts = r.timeseries
fig, ax = plt.subplots(figsize=(10, 3.5))
ax.plot(ts.t_s, ts.num_running, label="running")
ax.plot(ts.t_s, ts.num_waiting, label="waiting")
ax2 = ax.twinx(); ax2.plot(ts.t_s, ts.kv_used_blocks, color="gray", lw=0.8, label="KV blocks used")
ax.set(xlabel="simulated time (s)", ylabel="requests"); ax2.set_ylabel("KV blocks")
ax.legend(loc="upper left"); ax.grid(alpha=0.3)
r.requests[["ttft_s", "tpot_s", "e2el_s"]].describe().round(3)"""),
]

PROFILES = [
    ("md", "# Hardware profiles and their fits\n\n"
           "What a profile holds, where its numbers came from, how well its fitted tables predict "
           "held-out measurements, and what the cost model composes from them."),
    ("code", SETUP),
    ("code", """from simserve.hardware.profile import available_profiles, load_profile
pd.DataFrame([{"profile": n, "kind": load_profile(p).kind,
               "provenance": load_profile(p).provenance_type,
               "device": load_profile(p).spec.get("vendor_name")}
              for n, p in available_profiles().items()])"""),
    ("md", "## Held-out error of the measured H200 profile\n\n"
           "Every fourth measured point is removed, the table refitted, and the removed points "
           "predicted (`simserve profiles check h200-sxm`)."),
    ("code", """from simserve.calibrate.check import check_errors, summary
h200 = load_profile("h200-sxm")
summary(h200, check_errors(h200)).round(2)"""),
    ("md", "## Measured points against fits"),
    ("code", """from simserve.calibrate.tables import read_raw, fit_curve
from simserve.plots import profile_fit_1d
raw = read_raw("../hwprofiles/raw/h200-sxm")
d = raw[(raw.part == "gpu_dense") & (raw.model == "llama-3.1-8b") & (raw.tp == 1)]
fig, axs = plt.subplots(1, 3, figsize=(14, 4))
for ax, op in zip(axs, ["qkv", "gate_up", "lm_head"]):
    g = d[d.op == op]
    profile_fit_1d(g.tokens, g.median_us, fit_curve(op, g.tokens, g.median_us), f"{op}, Llama-3.1-8B TP1", ax=ax)
plt.tight_layout()"""),
    ("md", "## What the cost model predicts\n\n"
           "One decode iteration of Llama-3.1-8B as the batch grows, on the measured H200 and "
           "the derived GPUs."),
    ("code", """import numpy as np
from simserve.cost import GpuCostModel
from simserve.models import get_model
m = get_model("llama-3.1-8b")
batches = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256])
fig, ax = plt.subplots(figsize=(6, 4))
for gpu in ["h200-sxm", "h100-sxm", "h20", "rtx4090"]:
    c = GpuCostModel(m, load_profile(gpu), 1, None)
    ax.plot(batches, [c.decode_only_s(int(b), int(b) * 2048) * 1e3 for b in batches], "o-", label=gpu)
ax.set(xscale="log", xlabel="decode batch (2K context each)", ylabel="iteration time (ms)")
ax.grid(alpha=0.3); ax.legend()"""),
]


def build(cells, path: Path) -> None:
    nb = nbf.v4.new_notebook()
    nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src)
                for kind, src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbf.write(nb, path)


if __name__ == "__main__":
    build(WHAT_IF, HERE / "what_if.ipynb")
    build(PROFILES, HERE / "profiles.ipynb")
    print("wrote", HERE / "what_if.ipynb", HERE / "profiles.ipynb")
