"""What the real engine's own logs say about the tail misses simserve's replay leaves, per run.

    python -m simserve.realcheck.tail_causes [RUN ...] [--root validation/vllm-h200]

RUN is `<server>/<plan>` (default: every run). Each column is measured on the real run alone
(the probe's logs, `step_diff.real_steps`), so it names a cause without simserve's model:

- `send->queued` (ms, median / P90): from the client's send to the engine core taking the
  request (vLLM's `queued` timestamp: the API server's admission, the hand-off, and the wait
  for the engine-core loop to drain its input queue);
- `batched` (%): requests whose tokenisation ended within 0.5 ms of another's (the API
  server's `tokenize` calls in `probe/frontend-*`): vLLM's `AsyncMicrobatchTokenizer`
  tokenises concurrent prompts in one batch (up to 32), so a burst reaches the engine core
  together instead of one by one; `max` is the largest such group;
- `stall` (ms): the longest of the run's first five decode-only steps (launch or GPU time),
  against the run's median decode-only step: a one-off cold start (a first replay after the
  server's warm-up) that no steady-state model has;
- `eager L` (µs per layer, median): the run's eager launches (`execute_model` host time of
  batches beyond the CUDA-graph sizes) against the profile's fitted value.
"""
from __future__ import annotations

import argparse
import glob
import json
import lzma
import os

import numpy as np

from simserve.realcheck.serve_data import load_run, run_dirs
from simserve.realcheck.serve_score import ROOT, engine_meta

BATCH_S = 0.5e-3   # tokenisations ending this close together came from one tokenizer batch
_FRONT: dict = {}


def _frontend(server_dir: str) -> list[dict]:
    if server_dir not in _FRONT:
        _FRONT[server_dir] = sorted(
            (json.loads(x) for f in sorted(glob.glob(os.path.join(
                server_dir, "probe", "frontend-*.jsonl.xz"))) for x in lzma.open(f, "rt")),
            key=lambda r: r["t1"])
    return _FRONT[server_dir]


def tokenizer_groups(ends: np.ndarray) -> list[int]:
    """Sizes of the groups of tokenisation end times (sorted) within `BATCH_S` of a neighbour."""
    if not len(ends):
        return []
    sizes = [1]
    for a, b in zip(ends[:-1], ends[1:]):
        if b - a < BATCH_S:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return sizes


def stall_ms(steps) -> tuple[float, float]:
    """(the longest of the first five decode-only steps' launch or GPU time, the median of
    the run's decode-only steps) in ms."""
    t = [max(s.gpu_ms or 0.0, s.launch_ms or 0.0) for s in steps if s.kind == "decode"]
    return (max(t[:5]) if t else float("nan")), float(np.median(t)) if t else float("nan")


def run_causes(run_dir: str, root: str) -> dict:
    from simserve.models import get_model
    from simserve.realcheck.async_loop import graph_max, graph_mode
    from simserve.realcheck.step_diff import _probe, real_steps, vllm_id
    run = load_run(run_dir, os.path.join(root, "plans"))
    sd = os.path.dirname(run_dir.rstrip("/"))
    meta = engine_meta(sd)
    _, by_id = _probe(sd)
    queued = np.array([by_id[vllm_id(run.name, i)][1]["queued"] - run.origin
                       for i in range(len(run.send))])
    wait = (queued - run.send) * 1e3
    lo, hi = run.send.min() + run.origin, run.end.max() + run.origin
    ends = np.array([r["t1"] for r in _frontend(sd) if r["call"] == "tokenize"
                     and lo <= r["t0"] <= hi])
    groups = tokenizer_groups(ends)
    steps, _ = real_steps(run, sd, meta["async_scheduling"])
    stall, med = stall_ms(steps)
    gmax, layers = graph_max(meta), get_model(run.plan["model"]).num_layers
    eager = [s.launch_ms * 1e3 / layers for s in steps
             if s.launch_ms is not None and graph_mode(s, gmax) == "eager"]
    return {"server": run.server, "plan": run.name,
            "queued_ms": (float(np.median(wait)), float(np.percentile(wait, 90))),
            "batched_pct": 100.0 * sum(g for g in groups if g > 1) / max(len(ends), 1),
            "max_group": max(groups, default=0), "stall_ms": stall, "median_step_ms": med,
            "eager_us_per_layer": float(np.median(eager)) if eager else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--root", default=ROOT)
    a = ap.parse_args(argv)
    from simserve.cost.host import engine_host
    from simserve.hardware.profile import load_profile
    host = engine_host(load_profile("h200-sxm"), "vllm")
    fitted = (host.host_calls or {}).get("eager", {}).get("launch_us_per_layer") if host else None
    dirs = [os.path.join(a.root, r) for r in a.runs] if a.runs else run_dirs(a.root)
    print(f"eager launch fitted (profile): {fitted} µs per layer")
    print(f"{'server/plan':46s} {'send->queued':>14s} {'batched':>8s} {'max':>4s} "
          f"{'stall / median decode':>22s} {'eager L':>8s}")
    for d in dirs:
        c = run_causes(d, a.root)
        q50, q90 = c["queued_ms"]
        el = c["eager_us_per_layer"]
        print(f"{c['server'] + '/' + c['plan']:46s} {q50:6.1f} / {q90:5.1f} "
              f"{c['batched_pct']:7.0f}% {c['max_group']:4d} {c['stall_ms']:9.1f} / "
              f"{c['median_step_ms']:6.1f} ms {'-' if el is None else f'{el:6.0f}':>8s}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
