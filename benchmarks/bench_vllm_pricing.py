"""How much of `vllm`'s loop is pricing steps: the case for issue 14's 10,000 req/s bar.

    python benchmarks/bench_vllm_pricing.py [--case vllm-h100] [--repeat 7]

Runs one `bench_loop` case once with the cost model's three step-pricing entries wrapped to
record every call's arguments (decode leaps priced in plain floats, `decode_steps_list`;
longer ones in numpy, `decode_steps_s`; stepped iterations, `step_s`), then replays every
recorded call against the same cost model, untimed wrappers removed, and reports the
fastest of `--repeat` replays. It also times the whole loop (median of 3, unwrapped, after a
warm-up run) for the share.

The replay prices the same calls with the same floats as the loop, so its time is what
pricing costs per simulated request with today's float-exact formulas, whatever the rest of
the loop does. At 10,000 req/s the whole loop may take 100 µs per request.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_loop import CASES  # noqa: E402

from simserve.cost.gpu import GpuCostModel  # noqa: E402
from simserve.hardware.setup import HardwareConfig, resolve_hardware  # noqa: E402
from simserve.run import simulate_point  # noqa: E402
from simserve.runner.config import parse_experiment  # noqa: E402
from simserve.runner.point import make_workload  # noqa: E402

ENTRIES = ("decode_steps_list", "decode_steps_s", "step_s")


def setting(label: str):
    policy, s, params = CASES[label]
    cfg = parse_experiment({
        "model": s["model"], "hardware": s["hardware"],
        "workload": {"trace": s["trace"], "num_requests": s["n"], "arrival": "poisson",
                     "rates": [s["rate"]], "seed": 0},
        "policies": [{"name": policy, **params}]})
    w = make_workload(cfg, s["rate"], 0)
    hw = resolve_hardware(HardwareConfig(**s["hardware"]))
    return w, s["model"], hw, policy, cfg.policies[0].config, s["n"]


def record(args) -> tuple[dict, list]:
    """Every pricing call of one run: {entry: [args]} and the cost models that priced."""
    calls: dict = {e: [] for e in ENTRIES}
    models: list = []
    originals = {e: getattr(GpuCostModel, e) for e in ENTRIES}

    depth = [0]  # decode_steps_list falls back to decode_steps_s: record the outer call only

    def wrap(entry, fn):
        def wrapped(self, *a):
            if not models:
                models.append(self)
            elif self is not models[0]:
                raise SystemExit("bench_vllm_pricing: more than one cost model priced steps")
            if not depth[0]:
                calls[entry].append(a)
            depth[0] += 1
            try:
                return fn(self, *a)
            finally:
                depth[0] -= 1
        return wrapped

    for e, fn in originals.items():
        setattr(GpuCostModel, e, wrap(e, fn))
    try:
        simulate_point(*args)
    finally:
        for e, fn in originals.items():
            setattr(GpuCostModel, e, fn)
    return calls, models


def replay(model, calls: dict, repeat: int) -> dict:
    out = {}
    for e in ENTRIES:
        fn = getattr(model, e)
        best = float("inf")
        for _ in range(repeat):
            t0 = time.process_time()
            for a in calls[e]:
                fn(*a)
            best = min(best, time.process_time() - t0)
        out[e] = best
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="vllm-h100", choices=[c for c, v in CASES.items()
                                                            if v[0] in ("vllm", "sarathi")])
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args(argv)
    args = setting(a.case)
    n = args[-1]
    args = args[:-1]
    simulate_point(*args)  # warm-up: tables, fits
    loop = []
    for _ in range(3):
        t0 = time.process_time()
        simulate_point(*args)
        loop.append(time.process_time() - t0)
    loop_us = statistics.median(loop) / n * 1e6
    calls, models = record(args)
    times = replay(models[0], calls, a.repeat)
    print(f"case {a.case}: {n} requests; load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs; replay fastest of {a.repeat}")
    print(f"{'entry':20s} {'calls':>7s} {'steps':>8s} {'us/call':>8s} {'us/req':>7s} {'of loop':>8s}")
    total = 0.0
    for e in ENTRIES:
        c = calls[e]
        steps = len(c) if e == "step_s" else sum(x[3] for x in c)
        us_req = times[e] / n * 1e6
        total += us_req
        print(f"{e:20s} {len(c):7d} {steps:8d} {times[e] / max(len(c), 1) * 1e6:8.1f} "
              f"{us_req:7.1f} {us_req / loop_us:8.1%}")
    print(f"{'pricing, all':20s} {'':7s} {'':8s} {'':8s} {total:7.1f} {total / loop_us:8.1%}")
    print(f"loop (median of 3): {loop_us:.0f} us per request ({1e6 / loop_us:,.0f} req/CPU-s); "
          f"at 10,000 req/s the whole loop has 100 us, pricing alone takes {total:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
