"""Per-point cost of a sweep's results store: a cheap sweep of many points (default 2,000; a
tiny vLLM workload each), run in this process (one worker), timing every point from one stored
point to the next and the time spent writing summary.json / summary.csv / the marker.

    python benchmarks/bench_sweep_store.py [--points 2000] [--out DIR]

Prints the mean per-point cost over the first, middle and last 100 points and the summary
writes' total: with a rewrite after every point the last points cost more than the first
(the rewrite is O(points done)); with batched writes they cost the same.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

EXPERIMENT = """\
name: store-bench
model: llama-3.1-8b
hardware: {gpu: h100-sxm}
workload: {trace: synthetic-conversation, num_requests: 3, arrival: poisson, rates: [1], seed: 0}
policies:
  - {name: vllm}
sweep:
  workload.seed: [%s]
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=2000)
    ap.add_argument("--out", help="results folder (default: a temporary one, removed)")
    args = ap.parse_args(argv)

    from simserve.runner import sweep_store
    from simserve.runner.sweep import load_sweep
    from simserve.runner.sweep_run import run_sweep

    stamps: list[float] = []
    write_s = [0.0, 0]
    done, write = sweep_store.SummaryStore.done, sweep_store.write_summaries

    def timed_done(self, sp):
        done(self, sp)
        stamps.append(time.perf_counter())

    def timed_write(out, records):
        t = time.perf_counter()
        write(out, records)
        write_s[0] += time.perf_counter() - t
        write_s[1] += 1

    sweep_store.SummaryStore.done = timed_done
    sweep_store.write_summaries = timed_write
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        cfg = tmp / "sweep.yaml"
        cfg.write_text(EXPERIMENT % ", ".join(str(i) for i in range(args.points)))
        out = Path(args.out) if args.out else tmp / "out"
        sweep = load_sweep(cfg)
        t0 = time.perf_counter()
        res = run_sweep(sweep, out, workers=1, progress=False)
        total = time.perf_counter() - t0
    finally:
        if not args.out:
            shutil.rmtree(tmp, ignore_errors=True)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    n = len(gaps)

    def ms(xs):
        return 1e3 * statistics.mean(xs) if xs else float("nan")

    print(f"{res.num_run} points run in {total:.1f} s ({1e3 * total / max(res.num_run, 1):.1f} ms "
          f"a point); python {sys.version.split()[0]}")
    print(f"per-point cost, ms: first 100 {ms(gaps[:100]):.1f}, middle 100 "
          f"{ms(gaps[n // 2 - 50:n // 2 + 50]):.1f}, last 100 {ms(gaps[-100:]):.1f}")
    print(f"summary writes: {write_s[1]}, {write_s[0]:.1f} s in all "
          f"({100 * write_s[0] / total:.0f} % of the sweep)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
