"""Simulator loop speed per policy: simulated requests per wall-second, in-process.

    python benchmarks/bench_loop.py [--repeat N] [--only POLICY ...]

Each case builds its workload, hardware and policy config first (not timed), runs
`simulate_point` once to warm caches (cost tables, profile fits, conflux's dispatch margin),
then times N more runs (default 3) and prints the median: wall seconds, process CPU seconds,
simulated requests per wall-second and per CPU-second, iterations (and how many were stepped
one by one; the rest were leapt), and microseconds of CPU per request. Every case runs in its
own process, one after another. Other processes on the machine inflate wall time (the load
average is printed with the table): compare CPU columns, and ratios within one run. The
first line says whether the hot modules run compiled (simserve/compiled.py); with
SIMSERVE_PURE_PYTHON=1 every case runs from the Python source.

Cases (each policy at its paper's setting; `vllm` also at bar 2's point):
- vllm-h100: Llama-3.1-8B, 1x H100, the first 2,000 Azure-Conversation requests at 4 req/s,
  budget 2048 (issue 14's point); sarathi the same point with its defaults;
- vllm-h200: the same requests at 8 req/s on 1x H200 with `engine: vllm`, the measured host
  path: the API-server front end and the async engine-core loop (`policies/vllm_loop.py`);
- vllm / neo / dualpace: DualPace Fig. 9a, Llama-3.1-8B on one RTX 4090 with 12 cores of a
  Xeon Silver 4510 over PCIe 4 x16, 2,000 Azure-Conversation requests at 3.5 req/s;
- chunked / muxwise / distserve / loongserve / conflux: ConfluxServe Fig. 12, Qwen3-14B on
  4x H100, 1,000 synthetic Mooncake-Toolagent requests at 4 req/s, the figure's parameters;
  conflux also on 2,000 Mooncake-Synthetic requests at 2.5 req/s (the README's older row);
  muxwise and loongserve also at 1 req/s (`-low`), the lowest rate the figure sweeps.
All Poisson arrivals, seed 0. Traces come from ../shared/traces (SIMSERVE_TRACE_DIR overrides).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's simserve (it need not be installed)

H100 = dict(model="llama-3.1-8b", trace="azure-conv", n=2000, rate=4.0,
            hardware=dict(gpu="h100-sxm", num_gpus=1))
H200 = dict(H100, rate=8.0, hardware=dict(gpu="h200-sxm", num_gpus=1))
FIG9A = dict(model="llama-3.1-8b", trace="azure-conv", n=2000, rate=3.5,
             hardware=dict(gpu="rtx4090", num_gpus=1, cpu="xeon-silver-4510", cpu_cores=12,
                           pcie="pcie4-x16"))
FIG12 = dict(model="qwen3-14b", trace="synthetic-mooncake-toolagent", n=1000, rate=4.0,
             hardware=dict(gpu="h100-sxm", num_gpus=4))
FIG12_LOW = dict(FIG12, rate=1.0)  # the lowest rate experiments/conflux/fig12-qwen14b*.yaml sweep
MOONCAKE = dict(model="qwen3-14b", trace="mooncake-synthetic", n=2000, rate=2.5,
                hardware=dict(gpu="h100-sxm", num_gpus=4))
CASES = {  # label: (policy, setting, policy parameters)
    "vllm-h100": ("vllm", H100, {"max_num_batched_tokens": 2048}),
    "sarathi-h100": ("sarathi", H100, {}),
    "vllm-fig9a": ("vllm", FIG9A, {}),
    "neo-fig9a": ("neo", FIG9A, {}),
    "dualpace-fig9a": ("dualpace", FIG9A, {}),
    "chunked-fig12": ("chunked", FIG12, {"max_num_batched_tokens": 2048}),
    "muxwise-fig12": ("muxwise", FIG12, {"tbt_ms": 100}),
    "distserve-fig12": ("distserve", FIG12, {}),
    "loongserve-fig12": ("loongserve", FIG12, {"scheduler": "fcfs"}),
    "muxwise-fig12-low": ("muxwise", FIG12_LOW, {"tbt_ms": 100}),
    "loongserve-fig12-low": ("loongserve", FIG12_LOW, {"scheduler": "fcfs"}),
    "conflux-fig12": ("conflux", FIG12, {"scheduler": "slo", "ttft_ms": 2000, "tbt_ms": 100}),
    "conflux-mooncake": ("conflux", MOONCAKE, {}),
    "vllm-h200": ("vllm", H200, {"engine": "vllm"}),
}


def one(label: str, repeat: int) -> dict:
    import time

    from simserve.runner.config import parse_experiment
    from simserve.runner.point import make_workload
    from simserve.hardware.setup import HardwareConfig, resolve_hardware
    from simserve.run import simulate_point

    policy, s, params = CASES[label]
    cfg = parse_experiment({"model": s["model"], "hardware": s["hardware"],
                            "workload": {"trace": s["trace"], "num_requests": s["n"],
                                         "arrival": "poisson", "rates": [s["rate"]], "seed": 0},
                            "policies": [{"name": policy, **params}]})
    w = make_workload(cfg, s["rate"], 0)
    hw = resolve_hardware(HardwareConfig(**s["hardware"]))
    pc = cfg.policies[0].config
    simulate_point(w, s["model"], hw, policy, pc)  # warm-up
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        res = simulate_point(w, s["model"], hw, policy, pc)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return {"label": label, "policy": policy, "requests": w.num_requests,
            "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
            "iterations": res.stats["num_iterations"],
            "stepped": res.stats["num_iterations_stepped"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per case (median shown)")
    ap.add_argument("--only", nargs="+", metavar="POLICY_OR_LABEL",
                    help="only these policies or case labels")
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, max(args.repeat, 1))))
        return 0
    labels = [k for k, (p, _, _) in CASES.items()
              if not args.only or k in args.only or p in args.only]
    from simserve.compiled import summary
    print(f"{summary()}" + ("; SIMSERVE_PURE_PYTHON is set" if os.environ.get(
        "SIMSERVE_PURE_PYTHON") else ""))  # the cases' processes inherit the environment
    load0 = os.getloadavg()
    print(f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} on {os.cpu_count()} CPUs; "
          f"median of {args.repeat} runs per case, in-process after a warm-up run")
    print(f"{'case':18} {'requests':>8} {'wall s':>7} {'CPU s':>6} {'req/wall-s':>10} "
          f"{'req/CPU-s':>9} {'iterations':>10} {'stepped':>8} {'CPU us/req':>10}")
    rows = []
    for label in labels:
        out = subprocess.run([sys.executable, __file__, "--one", label, "--repeat",
                              str(args.repeat)], capture_output=True, text=True, env=os.environ, cwd=ROOT)
        if out.returncode:
            print(f"{label}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(r)
        n = r["requests"]
        print(f"{label:18} {n:8d} {r['wall_s']:7.3f} {r['cpu_s']:6.3f} {n / r['wall_s']:10.0f} "
              f"{n / r['cpu_s']:9.0f} {r['iterations']:10d} {r['stepped']:8d} "
              f"{1e6 * r['cpu_s'] / n:10.0f}", flush=True)
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
