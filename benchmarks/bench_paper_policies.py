"""Simulator speed of every policy on its paper setting (issue 14, bar 2: >= 2,000 simulated
requests per wall-second), at the lowest swept rate and a mid rate.

    python benchmarks/bench_paper_policies.py [--repeat 3] [--only POLICY ...] [-n N]
                                              [--digest] [--cases LABEL@RATE ...]

Settings (the experiments' own YAML; the policy entry picked by label, N requests, seed 0):
- ConfluxServe's Fig. 12 (Qwen3-14B, 4x H100, Mooncake-Toolagent-shaped, rates 1..9, SLO
  2 s / 100 ms): conflux (`confluxserve`), chunked (`chunked-2048`), loongserve, muxwise
  (`muxwise-fcfs`), distserve, at rates 1 (lowest) and 5 (mid);
- ConfluxServe's Fig. 16 left (the real Mooncake synthetic trace, lowest rate 0.5): loongserve
  and muxwise, the two that were slowest at low load;
- DualPace's Fig. 9a (Llama-3.1-8B, RTX 4090 + Xeon Silver 4510, Azure-Conversation, rates
  0.5..8): dualpace, neo, vllm at 0.5 (lowest) and 3.0 (mid).
Each run is a fresh process; imports, profile fits and building the workload are not timed,
only `simulate_point` (with --warm, after an untimed 20-request point in the same process). Printed: median wall seconds over --repeat runs, simulated requests per
wall-second (N / median wall), wall-µs per request, CPU-µs per request (median), iterations
(and how many stepped), the load average before and after. The machine is shared: compare
CPU-µs, and ratios within one run. --digest adds a sha256 of the point's summary (the metrics
`simserve run` writes to summary.json) and of its per-request frame, to check that a speed-up
changed no result.

Measured 2026-12-01 (load average 11-13 on the 2 cores: CPU-µs there run ~1.7-2x the same
code's at load ~1), N = 1,000, before = 38188c1, after = this branch; wall / CPU µs per request:
  loongserve fig12 r1    90,122 / 25,310  ->  6,086 / 1,831   (CPU 13.8x)
  loongserve fig12 r5    28,538 /  8,306  ->  6,320 / 1,795   (4.6x)
  loongserve fig16 r0.5 134,241 / 38,713  ->  6,911 / 1,892   (20.5x)
  muxwise    fig12 r1    20,429 /  5,767  ->  4,583 / 1,327   (4.3x)
  muxwise    fig12 r5    23,589 /  6,571  ->  4,387 / 1,224   (5.4x)
  muxwise    fig16 r0.5  27,467 /  7,540  ->  4,076 / 1,147   (6.6x)
Summaries and per-request frames (--digest) identical before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIG12 = "experiments/conflux/fig12-qwen14b.yaml"
FIG16 = "experiments/conflux/fig16-qwen14b-mooncake-synthetic.yaml"
FIG9A = "experiments/dualpace/fig09a-10a-14a-conv-llama8b-rtx4090.yaml"
# (policy, label in the YAML, YAML, rate)
CASES = ([(p, lab, FIG12, r) for p, lab in (("conflux", "confluxserve"), ("chunked", "chunked-2048"),
                                             ("loongserve", "loongserve"),
                                             ("muxwise", "muxwise-fcfs"),
                                             ("distserve", "distserve"))
          for r in (1.0, 5.0)]
         + [(p, lab, FIG16, 0.5) for p, lab in (("loongserve", "loongserve"),
                                                ("muxwise", "muxwise-fcfs"))]
         + [(p, p, FIG9A, r) for p in ("dualpace", "neo", "vllm") for r in (0.5, 3.0)])


def one(label: str, yaml: str, rate: float, n: int | None, digest: bool,
        warm: bool = False) -> dict:
    import hashlib
    import time

    from simserve.runner.config import load_experiment
    from simserve.runner.point import Point, make_workload
    from simserve.hardware.setup import resolve_hardware
    from simserve.run import simulate_point

    cfg = load_experiment(ROOT / yaml)
    if n is not None:
        import dataclasses
        cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, num_requests=n))
    spec = next(p for p in cfg.policies if p.label == label)
    w = make_workload(cfg, rate, 0)
    hw = resolve_hardware(cfg.hardware)
    if warm:  # a 20-request point first: per-process caches filled, as in a sweep worker
        import dataclasses
        small = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload,
                                                                      num_requests=20))
        simulate_point(make_workload(small, rate, 0), cfg.model, hw, spec.name, spec.config,
                       seed=0)
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate_point(w, cfg.model, hw, spec.name, spec.config, seed=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"wall_s": wall, "cpu_s": cpu, "n": w.num_requests,
           "iterations": res.stats["num_iterations"],
           "stepped": res.stats["num_iterations_stepped"]}
    if digest:
        from simserve.runner.point import run_point
        pr = run_point(cfg, Point(spec, rate, 0), hw, w)
        out["summary_sha"] = hashlib.sha256(
            json.dumps(pr.summary, sort_keys=True).encode()).hexdigest()[:16]
        out["requests_sha"] = hashlib.sha256(
            pr.requests.to_csv(index=False, float_format="%.17g").encode()).hexdigest()[:16]
    return out


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (median shown)")
    ap.add_argument("--only", nargs="+", metavar="POLICY", help="only these policies")
    ap.add_argument("--cases", nargs="+", metavar="LABEL@RATE", help="only these cases")
    ap.add_argument("-n", type=int, help="requests per point (default: the YAML's)")
    ap.add_argument("--digest", action="store_true", help="print result digests")
    ap.add_argument("--warm", action="store_true",
                    help="run a 20-request point in the process first (untimed): per-process "
                         "caches such as conflux's dispatch-margin calibration are then filled, "
                         "as for every point after a sweep worker's first")
    ap.add_argument("--one", nargs=3, metavar=("LABEL", "YAML", "RATE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        label, yaml, rate = args.one
        print(json.dumps(one(label, yaml, float(rate), args.n, args.digest, args.warm)))
        return 0
    print(f"# load before: {load()}  (2-core machine, shared){'  warm' if args.warm else ''}")
    print(f"{'policy':10} {'setting':7} {'rate':>4} {'N':>5} {'wall s':>7} {'req/wall-s':>10} "
          f"{'wall us/req':>11} {'CPU us/req':>10} {'iters':>8} {'stepped':>8}"
          + ("  summary_sha      requests_sha" if args.digest else ""))
    for policy, label, yaml, rate in CASES:
        if args.only and policy not in args.only:
            continue
        setting = Path(yaml).stem.split("-")[0]
        if args.cases and f"{label}@{rate:g}" not in args.cases:
            continue
        runs = []
        for _ in range(max(args.repeat, 1)):
            cmd = [sys.executable, __file__, "--one", label, yaml, str(rate)]
            cmd += (["-n", str(args.n)] if args.n else []) + (["--digest"] if args.digest else [])
            cmd += ["--warm"] if args.warm else []
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                return 1
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        n = runs[0]["n"]
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        r = runs[0]
        line = (f"{policy:10} {setting:7} {rate:4g} {n:5d} {wall:7.2f} {n / wall:10.0f} "
                f"{1e6 * wall / n:11.0f} {1e6 * cpu / n:10.0f} {r['iterations']:8d} "
                f"{r['stepped']:8d}")
        if args.digest:
            line += f"  {r['summary_sha']} {r['requests_sha']}"
        print(line, flush=True)
    print(f"# load after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
