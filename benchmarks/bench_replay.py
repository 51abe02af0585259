"""Simulator speed: simulated requests per wall-second, iterations per second, peak memory.

    python benchmarks/bench_replay.py [--trace-dir DIR]

1. The first 2,000 requests of Azure-Conversation at 4 req/s (exponential gaps, fixed seed)
   with `vllm` (token budget 2048) on Llama-3.1-8B / 1x H100.
2. Synthetic conversation workloads of 2k, 5k, 10k and 20k requests at 4 req/s, to show
   that cost grows linearly with the number of requests.
Each case runs in a fresh process so peak memory is its own (tracemalloc peak of Python
allocations during the simulation, and the process's max RSS).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = [("azure-conv", 2000), ("synthetic-conversation", 2000),
         ("synthetic-conversation", 5000), ("synthetic-conversation", 10000),
         ("synthetic-conversation", 20000)]


def one(trace: str, n: int, rate: float) -> dict:
    import resource
    import tracemalloc

    from simserve.runner.config import parse_experiment
    from simserve.runner.point import make_workload
    from simserve.hardware.setup import HardwareConfig, resolve_hardware
    from simserve.policies import make_config
    from simserve.run import simulate_point

    cfg = parse_experiment({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
                            "workload": {"trace": trace, "num_requests": n, "arrival": "poisson",
                                         "rates": [rate], "seed": 0},
                            "policies": [{"name": "vllm", "max_num_batched_tokens": 2048}]})
    w = make_workload(cfg, rate, 0)
    hw = resolve_hardware(HardwareConfig(gpu="h100-sxm"))
    pol = make_config("vllm", {"max_num_batched_tokens": 2048})
    simulate_point(w, "llama-3.1-8b", hw, "vllm", pol)  # warm caches and imports
    t0 = time.perf_counter()
    res = simulate_point(w, "llama-3.1-8b", hw, "vllm", pol)
    wall = time.perf_counter() - t0
    tracemalloc.start()  # a second run for memory: tracemalloc slows Python down
    simulate_point(w, "llama-3.1-8b", hw, "vllm", pol)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"trace": trace, "requests": n, "wall_s": wall, "req_per_s": n / wall,
            "iterations": res.stats["num_iterations"],
            "iterations_stepped": res.stats["num_iterations_stepped"],
            "iter_per_s": res.stats["num_iterations"] / wall,
            "sim_s": res.stats["sim_end_s"], "peak_alloc_mb": peak / 2**20,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--one", nargs=2, metavar=("TRACE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.rate)))
        return 0
    rows = []
    for trace, n in CASES:
        out = subprocess.run([sys.executable, __file__, "--rate", str(args.rate), "--one",
                              trace, str(n)], capture_output=True, text=True, env=os.environ)
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    hdr = (f"{'workload':24} {'requests':>8} {'wall s':>7} {'req/s':>7} {'iters':>8} "
           f"{'stepped':>7} {'iter/s':>9} {'sim s':>7} {'alloc MB':>8} {'RSS MB':>7}")
    print(f"vllm, Llama-3.1-8B, 1x H100 (derived profile), {args.rate:g} req/s, budget 2048")
    print(hdr)
    for r in rows:
        print(f"{r['trace']:24} {r['requests']:8d} {r['wall_s']:7.3f} {r['req_per_s']:7.0f} "
              f"{r['iterations']:8d} {r['iterations_stepped']:7d} {r['iter_per_s']:9.0f} "
              f"{r['sim_s']:7.0f} {r['peak_alloc_mb']:8.1f} {r['max_rss_mb']:7.0f}")
    syn = [r for r in rows if r["trace"].startswith("synthetic")]
    base = syn[0]["wall_s"] / syn[0]["requests"]
    print("wall per request relative to 2k synthetic: " + ", ".join(
        f"{r['requests'] // 1000}k {r['wall_s'] / r['requests'] / base:.2f}x" for r in syn))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
