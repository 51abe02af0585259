"""Simulator speed per policy: wall and CPU seconds of one 2,000-request replay.

    python benchmarks/bench_policies.py [--repeat N] [--only POLICY ...]

- vllm, neo and dualpace in DualPace's Fig. 9a setting: Llama-3.1-8B on one RTX 4090 with 12
  cores of a Xeon Silver 4510 over PCIe 4 x16, the first 2,000 Azure-Conversation requests,
  Poisson arrivals (seed 0) at 2, 3.5 and 5 req/s, each policy's defaults;
- conflux on ConfluxServe's setting: Qwen3-14B on 4x H100, 2,000 Mooncake-Synthetic requests,
  Poisson arrivals (seed 0) at 1 and 2.5 req/s, defaults.
Each case runs in a fresh process (imports, profile fits and trace reading are not timed; the
workload is built first). Traces come from ../shared/traces (SIMSERVE_TRACE_DIR overrides).
Columns: wall and process CPU seconds of `simulate_point`, simulated requests per
wall-second, iterations (and how many were stepped one by one, the rest leapt), CPU
milliseconds per request. Other processes on the machine inflate wall time: compare CPU.
With --repeat N each case runs N times (fresh processes) and the fastest is shown.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

FIG9A = dict(model="llama-3.1-8b", trace="azure-conv",
             hardware=dict(gpu="rtx4090", num_gpus=1, cpu="xeon-silver-4510", cpu_cores=12,
                           pcie="pcie4-x16"))
CONFLUX = dict(model="qwen3-14b", trace="mooncake-synthetic",
               hardware=dict(gpu="h100-sxm", num_gpus=4))
CASES = ([(p, r, FIG9A) for p in ("vllm", "neo", "dualpace") for r in (2.0, 3.5, 5.0)]
         + [("conflux", r, CONFLUX) for r in (1.0, 2.5)])
N = 2000


def one(policy: str, rate: float, setting: dict) -> dict:
    import time

    from simserve.runner.config import parse_experiment
    from simserve.runner.point import make_workload
    from simserve.hardware.setup import HardwareConfig, resolve_hardware
    from simserve.policies import make_config
    from simserve.run import simulate_point

    cfg = parse_experiment({"model": setting["model"], "hardware": setting["hardware"],
                            "workload": {"trace": setting["trace"], "num_requests": N,
                                         "arrival": "poisson", "rates": [rate], "seed": 0},
                            "policies": [{"name": policy}]})
    w = make_workload(cfg, rate, 0)
    hw = resolve_hardware(HardwareConfig(**setting["hardware"]))
    pc = make_config(policy, {})
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate_point(w, setting["model"], hw, policy, pc)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"policy": policy, "rate": rate, "wall_s": wall, "cpu_s": cpu,
            "iterations": res.stats["num_iterations"],
            "stepped": res.stats["num_iterations_stepped"], "sim_s": res.stats["sim_end_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; the fastest is shown")
    ap.add_argument("--only", nargs="+", metavar="POLICY", help="only these policies")
    ap.add_argument("--one", nargs=2, metavar=("POLICY", "RATE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        policy, rate = args.one[0], float(args.one[1])
        setting = next(s for p, r, s in CASES if p == policy)
        print(json.dumps(one(policy, rate, setting)))
        return 0
    print(f"{'policy':9} {'req/s':>5} {'wall s':>7} {'CPU s':>6} {'sim req/wall-s':>14} "
          f"{'iterations':>10} {'stepped':>8} {'CPU ms/req':>10}")
    for policy, rate, _ in CASES:
        if args.only and policy not in args.only:
            continue
        runs = []
        for _ in range(max(args.repeat, 1)):
            out = subprocess.run([sys.executable, __file__, "--one", policy, str(rate)],
                                 capture_output=True, text=True, env=os.environ)
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                return 1
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = min(runs, key=lambda x: x["cpu_s"])
        wall = min(x["wall_s"] for x in runs)
        print(f"{policy:9} {rate:5g} {wall:7.2f} {r['cpu_s']:6.2f} {N / wall:14.0f} "
              f"{r['iterations']:10d} {r['stepped']:8d} {1e3 * r['cpu_s'] / N:10.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
