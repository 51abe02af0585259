"""Read measured real-vLLM serving runs (`validation/vllm-h200/<server>/<plan>/`) and compute
their metrics as `vllm bench serve` does.

A run folder holds `run.json` (the client's start on the host's monotonic clock) and
`requests.jsonl[.xz]`, one row per request: scheduled and actual send time, every streamed
chunk as (receive time, cumulative output tokens), end time. The plan it replayed is
`validation/vllm-h200/plans/<plan>.json`.

Metrics (ms unless named otherwise), per vLLM's benchmark client: TTFT = first chunk − send;
ITL = every gap between consecutive chunks of a request, pooled; TPOT = (E2E − TTFT) /
(output − 1); duration = last end − first scheduled send; throughputs over that duration.
"""
from __future__ import annotations

import json
import lzma
import os
from dataclasses import dataclass

import numpy as np


@dataclass
class RealRun:
    name: str            # plan name
    server: str          # server folder (e.g. llama-default)
    plan: dict
    origin: float        # the client's t_start (monotonic s)
    send: np.ndarray     # s after origin
    first: np.ndarray    # first chunk, s after origin
    end: np.ndarray
    chunks: list         # per request: array of chunk receive times (s after origin)
    prompt: np.ndarray
    output: np.ndarray
    max_concurrency: int | None


def _open(path: str):
    if os.path.exists(path + ".xz"):
        return lzma.open(path + ".xz", "rt")
    return open(path)


def load_run(run_dir: str, plans_dir: str) -> RealRun:
    with open(os.path.join(run_dir, "run.json")) as f:
        meta = json.load(f)
    with open(os.path.join(plans_dir, meta["plan"] + ".json")) as f:
        plan = json.load(f)
    with _open(os.path.join(run_dir, "requests.jsonl")) as f:
        rows = sorted((json.loads(x) for x in f), key=lambda r: r["i"])
    bad = [r["i"] for r in rows if r["error"] or not r["chunks"]]
    if bad:
        raise ValueError(f"{run_dir}: {len(bad)} requests failed or streamed nothing")
    o = meta["t_start_mono"]
    chunks = []
    for r in rows:
        t = np.array([c[0] for c in r["chunks"]]) - o
        n = np.array([c[1] for c in r["chunks"]])
        keep = np.concatenate(([True], np.diff(n) > 0))  # a chunk that added no token
        chunks.append(t[keep])
    return RealRun(
        name=meta["plan"], server=os.path.basename(os.path.dirname(run_dir.rstrip("/"))),
        plan=plan, origin=o, send=np.array([r["send"] for r in rows]) - o,
        first=np.array([c[0] for c in chunks]), end=np.array([r["end"] for r in rows]) - o,
        chunks=chunks, prompt=np.array([r["prompt"] for r in rows]),
        output=np.array([r["output"] for r in rows]), max_concurrency=meta.get("max_concurrency"))


def bench_metrics(send, first, end, token_times, output) -> dict:
    """The `vllm bench serve` summary of one run from per-request times (s)."""
    ttft = (first - send) * 1e3
    e2e = (end - send) * 1e3
    n = np.asarray(output)
    multi = n > 1
    tpot = (e2e[multi] - ttft[multi]) / (n[multi] - 1)
    itl = np.concatenate([np.diff(t) for t in token_times]) * 1e3
    duration = float(np.max(end) - min(0.0, float(np.min(send))))
    pct = lambda x, q: float(np.percentile(x, q)) if len(x) else float("nan")  # noqa: E731
    return {
        "duration_s": duration,
        "request_throughput": len(n) / duration,
        "output_throughput": float(n.sum()) / duration,
        "mean_ttft_ms": float(ttft.mean()), "median_ttft_ms": pct(ttft, 50),
        "p99_ttft_ms": pct(ttft, 99),
        "mean_tpot_ms": float(tpot.mean()) if len(tpot) else float("nan"),
        "p99_tpot_ms": pct(tpot, 99),
        "mean_itl_ms": float(itl.mean()) if len(itl) else float("nan"),
        "median_itl_ms": pct(itl, 50), "p99_itl_ms": pct(itl, 99),
        "mean_e2el_ms": float(e2e.mean()),
    }


def real_metrics(run: RealRun) -> dict:
    return bench_metrics(run.send, run.first, run.end, run.chunks, run.output)


def run_dirs(root: str) -> list[str]:
    """Every measured run under `root` (server folders holding plan folders), sorted."""
    out = []
    for server in sorted(os.listdir(root)):
        sd = os.path.join(root, server)
        if not os.path.isdir(sd) or server in ("plans", "kernels"):
            continue
        for p in sorted(os.listdir(sd)):
            if os.path.exists(os.path.join(sd, p, "run.json")):
                out.append(os.path.join(sd, p))
    return out
