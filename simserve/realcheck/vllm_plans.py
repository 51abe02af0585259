"""Request lists ("plans") for measuring real vLLM, and the campaign that orders them.

A plan is the exact list a client sends and the simulator replays: per request its scheduled
send offset `t` (s), prompt length `p`, output length `o` and, for Mooncake traces, block
hashes `h`. Plans are built here (torch-free, from simserve's trace readers) and committed
beside the measurements, so a later run or a re-score uses the same requests.

Workloads (names as `vllm bench serve` uses them where it has one):
- `random`: fixed 1,024-token prompts and 128-token outputs (`--random-input-len 1024
  --random-output-len 128 --random-range-ratio 0`), Poisson arrivals;
- `short`: fixed 32-token prompts and 16-token outputs, Poisson arrivals at up to hundreds
  of requests per second: the GPU is nearly idle, so the API server's per-request work
  decides TTFT (held out from the front end's fit, which used the other workloads);
- `conv`, `code`: the Azure LLM inference 2023 traces' lengths in trace order, Poisson
  arrivals at the plan's rate;
- `mooncake`: the Mooncake conversation trace's first requests with their own arrival
  pattern compressed to the plan's rate, prompts built from its `hash_ids` so that prefix
  caching sees the trace's reuse.
Rates are fractions of the saturated throughput simserve predicts for each model and
workload (`KNEE`), from light load to past the knee; `inf` sends everything at t = 0.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

WINDOW_S = 8.0          # arrival window of an open-loop point
MIN_REQUESTS = 40
FRACTIONS = (0.2, 0.5, 0.8, 1.0, 1.25)
# saturated request throughput (req/s) of `vllm` (8,192-token budget) on h200-sxm, simserve
# before this work; only used to place the measured rates around each knee
KNEE = {("llama-3.1-8b", "random"): 31.0, ("llama-3.1-8b", "conv"): 23.5,
        ("llama-3.1-8b", "code"): 15.6, ("qwen3-14b", "random"): 16.7,
        ("qwen3-14b", "conv"): 14.0, ("qwen3-14b", "code"): 8.6}
TRACE_FILES = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv",
               "mooncake": "conversation_trace.jsonl"}


def _poisson(n: int, rate: float, seed: int) -> np.ndarray:
    if rate == float("inf"):
        return np.zeros(n)
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))


def _lengths(workload: str, n: int, trace_dir: str, offset: int, max_len: int):
    if workload == "random":
        return np.full(n, 1024), np.full(n, 128), None, None
    if workload == "short":
        return np.full(n, 32), np.full(n, 16), None, None
    path = os.path.join(trace_dir, TRACE_FILES[workload])
    if workload == "mooncake":
        rows = []
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["input_length"] + r["output_length"] <= max_len:
                    rows.append(r)
                if len(rows) >= offset + n:
                    break
        rows = rows[offset:offset + n]
        return (np.array([r["input_length"] for r in rows]),
                np.array([r["output_length"] for r in rows]),
                [r["hash_ids"] for r in rows],
                np.array([r["timestamp"] for r in rows], dtype=float) / 1000.0)
    from simserve.workload.readers import read_trace
    w = read_trace(path)
    keep = np.flatnonzero(w.prompt_tokens + w.output_tokens <= max_len)[offset:offset + n]
    return w.prompt_tokens[keep], w.output_tokens[keep], None, None


def make_plan(model: str, workload: str, rate: float, *, n: int | None = None,
              max_concurrency: int | None = None, seed: int = 0, trace_dir: str = "",
              max_len: int = 32768, offset: int = 0) -> dict:
    if n is None:
        n = max(MIN_REQUESTS, int(round(rate * WINDOW_S))) if rate != float("inf") else 200
    p, o, h, ts = _lengths(workload, n, trace_dir, offset, max_len)
    n = len(p)
    if ts is not None and rate != float("inf"):   # the trace's own pattern, compressed
        span = max(ts[-1] - ts[0], 1e-9)
        t = (ts - ts[0]) * ((n - 1) / rate) / span
    else:
        t = _poisson(n, rate, seed) if rate != float("inf") else np.zeros(n)
    t = np.maximum(t - t[0], 0.0)
    r_name = "inf" if rate == float("inf") else f"{rate:g}"
    name = f"{model}-{workload}-r{r_name}" + (f"-c{max_concurrency}" if max_concurrency else "")
    reqs = []
    for i in range(n):
        q = {"i": i, "t": round(float(t[i]), 6), "p": int(p[i]), "o": int(o[i])}
        if h is not None:
            q["h"] = [int(x) for x in h[i]]
        reqs.append(q)
    return {"name": name, "model": model, "workload": workload, "rate": rate,
            "max_concurrency": max_concurrency, "seed": seed, "requests": reqs}


def model_plans(model: str, trace_dir: str, max_len: int, with_mooncake: bool) -> list[dict]:
    out = []
    for wl in ("random", "conv", "code"):
        knee = KNEE[(model, wl)]
        for f in FRACTIONS:
            out.append(make_plan(model, wl, round(knee * f, 1), trace_dir=trace_dir,
                                 max_len=max_len, seed=len(out)))
        if wl != "code":
            out.append(make_plan(model, wl, float("inf"), n=200, max_concurrency=16,
                                 trace_dir=trace_dir, max_len=max_len, seed=len(out)))
    out.append(make_plan(model, "random", float("inf"), n=200, trace_dir=trace_dir,
                         max_len=max_len, seed=len(out)))
    if with_mooncake:
        for r in (2.0, 4.0):
            out.append(make_plan(model, "mooncake", r, n=60, trace_dir=trace_dir,
                                 max_len=max_len))
    return out


def short_plans(model: str) -> list[dict]:
    """Many small requests: light, near and past the API server's request rate."""
    return [make_plan(model, "short", r, n=n, seed=100 + k)
            for k, (r, n) in enumerate(((50.0, 400), (100.0, 800), (200.0, 800),
                                         (float("inf"), 600)))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="write the measurement plans")
    ap.add_argument("--out", required=True)
    ap.add_argument("--trace-dir", default=os.environ.get("SIMSERVE_TRACE_DIR", "../shared/traces"))
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    plans = (model_plans("llama-3.1-8b", a.trace_dir, 131072, True)
             + model_plans("qwen3-14b", a.trace_dir, 40960, False)
             + short_plans("llama-3.1-8b") + short_plans("qwen3-14b"))
    for pl in plans:
        with open(os.path.join(a.out, pl["name"] + ".json"), "w") as f:
            json.dump(pl, f, separators=(",", ":"))
    print(f"{len(plans)} plans, {sum(len(p['requests']) for p in plans)} requests -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
