"""SGLang's step log (written by `benchmarks/sglang_device_plan.py` inside the scheduler
process) read into `step_diff`'s steps, and scored against simserve's cost model.

    python -m simserve.realcheck.sglang_steps DIR [--engine generic|ideal|vllm] [--gpu h200-sxm]

DIR holds what the device run brought back, unpacked: `steps-<pid>.jsonl[.xz]` (one row per
`Scheduler.run_batch`: wall start and end on `time.monotonic()`, the GPU time between CUDA
events on the forward stream, SGLang's forward mode, and per request its id, tokens run in
this step, tokens computed before it and prompt length), `requests-<plan>.jsonl[.xz]` (per
request its send time and every streamed chunk's time) and `meta.json` (the model, SGLang's
resolved server arguments). Request ids are `<plan>-<i>`, `i` the plan's request index.

Per plan it prints the step count by kind (mixed / decode / prefill, as `step_diff` names
them), each real step priced by simserve's cost model on its real composition (GPU time
against the CUDA-event interval; step period against the interval between launches where
the scheduler ran back to back), and the run's mean TTFT and P99 ITL as the client saw them.
"""
from __future__ import annotations

import argparse
import glob
import json
import lzma
import os
import sys

import numpy as np

from simserve.realcheck.step_diff import KINDS, Step, step_time_errors

STEP_KEYS = ("t0", "t1", "gpu_ms", "mode", "rids", "n", "computed", "prompt")
FOREIGN = 10**6        # indices given to requests of no plan (warm-up) sharing a step


def _open(path: str):
    return lzma.open(path, "rt") if path.endswith(".xz") else open(path)


def _rows(paths: list[str]) -> list[dict]:
    rows = []
    for p in paths:
        with _open(p) as f:
            for k, line in enumerate(f, 1):
                if not line.strip():
                    continue
                r = json.loads(line)
                missing = [key for key in STEP_KEYS if key not in r]
                if missing:
                    raise ValueError(f"{p}:{k}: step row lacks {', '.join(missing)}")
                rows.append(r)
    return rows


def load_steps(folder: str) -> list[dict]:
    """Every scheduler step of the run, by start time."""
    paths = sorted(glob.glob(os.path.join(folder, "steps-*.jsonl*")))
    if not paths:
        raise FileNotFoundError(f"{folder}: no steps-*.jsonl")
    return sorted(_rows(paths), key=lambda r: r["t0"])


def load_requests(folder: str, plan: str) -> list[dict]:
    paths = glob.glob(os.path.join(folder, f"requests-{plan}.jsonl*"))
    if not paths:
        raise FileNotFoundError(f"{folder}: no requests-{plan}.jsonl")
    with _open(paths[0]) as f:
        return sorted((json.loads(x) for x in f if x.strip()), key=lambda r: r["i"])


def plans_in(folder: str) -> list[str]:
    names = [os.path.basename(p)[len("requests-"):].split(".jsonl")[0]
             for p in glob.glob(os.path.join(folder, "requests-*.jsonl*"))]
    return sorted(set(names))


def plan_steps(rows: list[dict], plan: str, origin: float = 0.0) -> list[Step]:
    """The steps that ran any request of `plan`, as `step_diff.Step`s (times in s after
    `origin`; requests keyed by plan index, others by FOREIGN + k)."""
    prefix, foreign = f"{plan}-", {}
    steps = []
    for r in rows:
        mine = [rid.startswith(prefix) and rid[len(prefix):].isdigit() for rid in r["rids"]]
        if not any(mine):
            continue
        reqs, prompt = {}, {}
        for rid, own, n, c, p in zip(r["rids"], mine, r["n"], r["computed"], r["prompt"]):
            i = int(rid[len(prefix):]) if own else foreign.setdefault(rid, FOREIGN + len(foreign))
            reqs[i], prompt[i] = (int(n), int(c)), int(p)
        st = Step(r["t0"] - origin, reqs, prompt, r.get("gpu_ms"))
        st.sched_t0, st.sched_ms = st.t0, (r["t1"] - r["t0"]) * 1e3
        steps.append(st)
    # the period where the scheduler ran back to back: one launch to the next (with SGLang's
    # overlap schedule the next batch is launched while this one runs, so launches pace steps)
    for a, b in zip(steps, steps[1:]):
        p = (b.t0 - a.t0) * 1e3
        if a.gpu_ms is not None and 0 < p <= 3 * a.gpu_ms + 20:
            a.period_ms = p
    return steps


def client_metrics(reqs: list[dict]) -> dict:
    """Mean TTFT and P99 ITL (ms) as the client saw them."""
    ttft = [r["chunks"][0] - r["send"] for r in reqs if r["chunks"]]
    itl = np.concatenate([np.diff(r["chunks"]) for r in reqs if len(r["chunks"]) > 1]
                         or [np.zeros(0)])
    return {"requests": len(reqs), "mean_ttft_ms": float(np.mean(ttft) * 1e3) if ttft else None,
            "p99_itl_ms": float(np.percentile(itl, 99) * 1e3) if len(itl) else None}


def cost_model(model: str, gpu: str, engine: str):
    """simserve's cost model for `model` on `gpu` under `engine`, as the vLLM loop prices a
    step (captured from a one-request simulation)."""
    from simserve.hardware.setup import HardwareConfig
    from simserve.run import simulate_point
    from simserve.workload.spec import Workload
    w = Workload(arrival_s=np.zeros(1), prompt_tokens=np.array([16]),
                 output_tokens=np.array([2]), name="cost")
    costs: list = []

    def hook(c):
        costs.append(c)
        return c
    simulate_point(w, model, HardwareConfig(gpu=gpu), "vllm", gpu_cost_hook=hook, engine=engine)
    return costs[0]


def score(folder: str, engine: str = "generic", gpu: str = "h200-sxm") -> list[dict]:
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    rows = load_steps(folder)
    cost = cost_model(meta["model"], gpu, engine)
    out = []
    for plan in plans_in(folder):
        steps = plan_steps(rows, plan)
        kinds = {k: sum(s.kind == k for s in steps) for k in KINDS}
        out.append({"plan": plan, "steps": len(steps), "kinds": kinds,
                    "step_time": step_time_errors(steps, cost),
                    "client": client_metrics(load_requests(folder, plan))})
    return out


def format_rows(rows: list[dict], engine: str) -> str:
    lines = [f"SGLang steps priced by simserve (engine: {engine}); |error| mean %, bias % "
             "(GPU time / step period), by kind"]
    for d in rows:
        c = d["client"]
        ttft = "-" if c["mean_ttft_ms"] is None else f"{c['mean_ttft_ms']:.1f}"
        itl = "-" if c["p99_itl_ms"] is None else f"{c['p99_itl_ms']:.1f}"
        lines.append(f"{d['plan']}: {d['steps']} steps "
                     + " ".join(f"{k} {n}" for k, n in d["kinds"].items())
                     + f"; {c['requests']} requests, mean TTFT {ttft} ms, P99 ITL {itl} ms")
        for k in KINDS:
            g, p = d["step_time"][k]["gpu"], d["step_time"][k]["period"]
            if g["n"]:
                per = (f"; period {p['mean_abs_pct']:.1f} / {p['bias_pct']:+.1f} (n {p['n']})"
                       if p["n"] else "")
                lines.append(f"  {k:8s} gpu {g['mean_abs_pct']:.1f} / {g['bias_pct']:+.1f} "
                             f"(n {g['n']}, real {g['real_mean_ms']:.2f} ms){per}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="an unpacked SGLang device run (steps-*, requests-*, meta.json)")
    ap.add_argument("--engine", default="generic", choices=("generic", "ideal", "vllm"))
    ap.add_argument("--gpu", default="h200-sxm")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args(argv)
    try:
        rows = score(a.dir, a.engine, a.gpu)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"sglang_steps: {exc}", file=sys.stderr)
        return 2
    print(format_rows(rows, a.engine))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
