"""Sweep wall time with the local process pool, and the cost of a rerun that has nothing to do.

    python benchmarks/bench_sweep.py [--workers N] [--out DIR]

3 policies (vllm with token budgets 2048 and 8192, sarathi with 512) × 8 Poisson rates
(4, 8, ..., 32 req/s) × 2,000 synthetic-conversation requests on Llama-3.1-8B / 1x H100:
24 points. Bar: at most 30 s wall on the 2-core development machine. Then the same
sweep again, which must run no simulation.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

SWEEP = """\
name: bench-sweep
model: llama-3.1-8b
hardware: {gpu: h100-sxm, num_gpus: 1}
workload: {trace: synthetic-conversation, num_requests: 2000, arrival: poisson, seed: 0}
policies:
  - {name: vllm, label: vllm-2048, max_num_batched_tokens: 2048}
  - {name: vllm, label: vllm-8192, max_num_batched_tokens: 8192}
  - {name: sarathi, max_num_batched_tokens: 512}
slo: {ttft_ms: 5000, tbt_ms: 1500}
sweep:
  workload.rates: {range: [4, 32, 4]}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, help="processes (default: all cores)")
    ap.add_argument("--out", help="results folder (default: a temporary folder)")
    args = ap.parse_args()

    from simserve.runner.executors import available_cores
    from simserve.runner.sweep import load_sweep
    from simserve.runner.sweep_run import run_sweep

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench-sweep.yaml"
        path.write_text(SWEEP)
        out = Path(args.out) if args.out else Path(tmp) / "out"
        workers = args.workers or available_cores()
        t0 = time.perf_counter()
        sweep = load_sweep(path)
        first = run_sweep(sweep, out, workers=workers, progress=False)
        wall = time.perf_counter() - t0
        print(f"sweep of {len(sweep.points)} points (3 policies x 8 rates x 2,000 requests), "
              f"{workers} worker(s): {wall:.1f} s wall, {first.num_run} simulations "
              f"({'within' if wall <= 30 else 'OVER'} the 30 s bar)")
        t0 = time.perf_counter()
        again = run_sweep(load_sweep(path), out, workers=workers, progress=False)
        wall2 = time.perf_counter() - t0
        print(f"second run: {again.num_run} simulations, {again.num_skipped} points already "
              f"done, {wall2:.2f} s wall")
        ok = again.num_run == 0 and first.num_run == len(sweep.points)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
