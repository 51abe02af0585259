"""Result digests that a refactoring must leave unchanged, one line each:

    python benchmarks/result_digests.py loop [CASE ...]   # the bench_loop cases, full size
    python benchmarks/result_digests.py replay            # the committed real-vLLM runs

`loop`: per `bench_loop.py` case, a sha256 (16 hex digits) of every request's token times,
preemptions, first-token and finish times, then the iteration counts (all, and stepped).
`replay`: the same hash of each real-vLLM run replayed by `simserve.realcheck.serve_score`
(engine `vllm`). Run it before and after a change (SIMSERVE_PURE_PYTHON=1 for the source,
unset for a compiled build) and diff the outputs.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def record_hash(rec) -> str:
    h = hashlib.sha256()
    for a in (rec.token_times_s, rec.num_preemptions, rec.first_token_s, rec.finish_s):
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def loop(labels: list[str]) -> None:
    import bench_loop as B
    from simserve.hardware.setup import HardwareConfig, resolve_hardware
    from simserve.run import simulate_point
    from simserve.runner.config import parse_experiment
    from simserve.runner.point import make_workload
    for label in labels or B.CASES:
        policy, s, params = B.CASES[label]
        cfg = parse_experiment({
            "model": s["model"], "hardware": s["hardware"],
            "workload": {"trace": s["trace"], "num_requests": s["n"], "arrival": "poisson",
                         "rates": [s["rate"]], "seed": 0},
            "policies": [{"name": policy, **params}]})
        r = simulate_point(make_workload(cfg, s["rate"], 0), s["model"],
                           resolve_hardware(HardwareConfig(**s["hardware"])), policy,
                           cfg.policies[0].config)
        print(label, record_hash(r.records), r.stats["num_iterations"],
              r.stats["num_iterations_stepped"], flush=True)


def replay() -> None:
    from simserve.realcheck.serve_data import load_run, run_dirs
    from simserve.realcheck.serve_score import ROOT as RUNS, engine_meta, simulate_run
    n = 0
    for d in run_dirs(RUNS):
        run = load_run(d, os.path.join(RUNS, "plans"))
        _, rec = simulate_run(run, engine_meta(os.path.dirname(d)), "vllm")
        print(run.server, run.name, record_hash(rec), flush=True)
        n += 1
    print("replays", n)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("loop", "replay"):
        sys.exit(__doc__)
    loop(sys.argv[2:]) if sys.argv[1] == "loop" else replay()
