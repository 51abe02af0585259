"""The planner's bars on this machine: a plan of >= 2,000 candidates (Llama-3.1-8B and
Qwen3-32B over H100, H200, H20 and RTX 4090 + Xeon; vllm, sarathi, distserve, conflux,
dualpace, neo with their main knobs, 1-8 GPUs, routers), its analytical screen time, the
number simulated, wall time and peak memory, with the machine's load beside them.

    python benchmarks/bench_plan.py [--workers 2] [--out benchmarks/results/plan-DATE.txt]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

from report_io import emit

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--models", default="llama-3.1-8b,qwen3-32b")
    ap.add_argument("--plan-out",
                    help="where each model's plan folder goes (plan.csv, pareto.png, state); "
                         "default a fresh temporary folder, so nothing is resumed")
    args = ap.parse_args()
    if args.plan_out is None:
        import tempfile
        args.plan_out = tempfile.mkdtemp(prefix="bench-plan-")
    import dataclasses

    from simserve.plan import load_plan, plan
    lines = [f"date: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC",
             (f"load average before: {os.getloadavg()} on {os.cpu_count()} cores "
             "(shared with other engineers' jobs)")]
    base = load_plan(HERE / "plan-large.yaml")
    total = {"cand": 0, "sim": 0, "screen": 0.0, "wall": 0.0}
    for m in args.models.split(","):
        spec = dataclasses.replace(base, model=m, name=f"large-{m}")
        t = time.perf_counter()
        res = plan(spec, out=Path(args.plan_out) / m, workers=args.workers,
                   progress=False)
        wall = time.perf_counter() - t
        total["cand"] += res.meta["num_candidates"]
        total["sim"] += res.meta["num_simulated"]
        total["screen"] += res.meta["screen_s"]
        total["wall"] += wall
        lines += ["", f"== {m}", res.summary(), res.table(15)]
        if res.winner is not None:   # the winner's YAML, three seeds the plan never ran
            from simserve.api import run_experiment
            df = run_experiment(Path(args.plan_out) / m / "winner.yaml")
            att = ", ".join(f"seed {s}: {a:.1%}" for s, a in zip(df["seed"], df["slo_attainment"]))
            ok = bool((df["slo_attainment"] >= spec.attainment).all())
            lines.append(f"winner.yaml at {spec.rate:g} req/s with fresh seeds: {att} "
                         f"-> {'meets' if ok else 'MISSES'} the {spec.attainment:.0%} SLO")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    lines += ["", f"plan folders (tables, Pareto plots): {args.plan_out}",
              (f"total: {total['cand']} candidates, screen {total['screen']:.1f} s, "
              f"{total['sim']} simulated, wall {total['wall']:.0f} s; peak RSS {peak:.0f} MiB "
              f"(this process), {kids:.0f} MiB (largest worker)"),
              f"load average after: {os.getloadavg()}"]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
