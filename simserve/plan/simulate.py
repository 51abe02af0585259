"""One candidate's simulated capacity: its experiment (the YAML `simserve run` reads) and a
capacity bisection on `run_point`, as a picklable task the sweep executors run."""
from __future__ import annotations

import math

import numpy as np

from simserve.plan.space import Candidate

# per-point metrics kept for the plan's table and Pareto plots
KEEP = ("slo_attainment", "keep_up_ratio", "request_goodput", "output_throughput",
        "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "p99_itl_ms",
        "prefix_cache_hit_rate")
KEEP_UP = 0.95   # the offered work must be kept up with too (capacity.SUSTAINED_GOODPUT)
# ...where a point has enough requests for keep_up_ratio to mean it: over the second half of
# a short arrival window the requests still in flight weigh so much that a system well below
# its capacity scores under 0.95 (50 requests of synthetic-conversation on an H100: 0.93 at
# a tenth of its capacity)
KEEP_UP_MIN_REQUESTS = 400


def experiment(spec, c: Candidate, rates, seeds, num_requests: int | None = None) -> dict:
    """The experiment mapping of candidate `c` (what the winner's YAML holds)."""
    wl = {**spec.workload, "rates": [float(r) for r in rates], "seeds": [int(s) for s in seeds]}
    if num_requests is not None:
        wl["num_requests"] = int(num_requests)
    return {"name": f"{spec.name}-{c.design}", "model": c.model, "hardware": c.hardware(),
            "workload": wl, "policies": [{"name": c.policy, **c.opts}],
            "slo": dict(spec.slo)}


def target_expr(attainment: float, num_requests: int, targets=()) -> str:
    """Capacity target: SLO attainment on every seed, the plan's percentile targets, and
    keeping up where that can be told."""
    parts = [f"slo_attainment>={attainment:g}", *targets]
    if num_requests >= KEEP_UP_MIN_REQUESTS:
        parts.append(f"keep_up_ratio>={KEEP_UP:g}")
    return " & ".join(parts)


def bisect_task(item: dict, shared=None) -> dict:
    """Capacity of one candidate: bisection on the rate, each probe judged on its worst seed
    (so the rate holds for every seed, not on average). Errors a configuration raises when it
    is built (a request that does not fit, ...) come back as {"error": message}."""
    from simserve.capacity import bisect_capacity, parse_target
    from simserve.errors import SimserveError
    from simserve.hardware.setup import resolve_hardware
    from simserve.runner.config import parse_experiment
    from simserve.runner.point import Point, run_point
    target = parse_target(item["target"])
    try:
        cfg = parse_experiment(item["experiment"], "<plan>")
        hw = resolve_hardware(cfg.hardware)
    except SimserveError as exc:
        return {"error": str(exc)}
    pol = cfg.policies[0]
    seen: dict[float, list[dict]] = {}

    def evaluate(rate: float) -> float:
        sums = [run_point(cfg, Point(pol, rate, s), hw).summary for s in cfg.workload.seeds]
        seen[rate] = sums
        worst = math.inf
        for s in sums:
            vals = [s.get(p.metric) for p in target.parts]
            if any(v is None or not p.passes(float(v)) for v, p in zip(vals, target.parts)):
                return math.nan   # fails on this seed
            worst = min(worst, float(s[target.metric]))
        return worst

    try:
        cap = bisect_capacity(evaluate, target, start=tuple(item["start"]), rtol=item["rtol"],
                              hi=item.get("hi"), max_expand=12)
    except SimserveError as exc:
        return {"error": str(exc)}
    passing = [r for r, v in cap.probes if target.passes(v)]
    sustained = max(passing) if passing else 0.0
    at = {}
    if passing:
        sums = seen[sustained]
        at = {k: float(np.mean([s[k] for s in sums if s.get(k) is not None]))
              for k in KEEP if any(s.get(k) is not None for s in sums)}
    return {"rate": sustained, "censored": bool(cap.censored),
            "bracket": list(cap.bracket) if cap.bracket else None,
            "num_simulations": len(seen) * len(cfg.workload.seeds),
            "probes": [[r, v] for r, v in cap.probes], "at": at}
