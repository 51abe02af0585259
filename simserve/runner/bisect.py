"""Sustainable rate of every policy of an experiment by bisection on the rate: each probe runs
`run_point` (seeds averaged); `simserve.capacity.bisect_capacity` does the search."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from simserve.capacity import Capacity, Target, bisect_capacity
from simserve.errors import SimserveError
from simserve.hardware.setup import resolve_hardware
from simserve.runner.point import Point, run_point, validate


def bisect_experiment(cfg, targets: list[Target], *, lo=None, hi=None, rtol=0.02, atol=None,
                      log: Callable[[str], None] | None = None,
                      progress: bool = False) -> tuple[list[Capacity], int]:
    """Bisection for every policy of an experiment and every target: each probe runs one
    `run_point` per seed (seeds averaged). Simulations are cached across targets; returns the
    results and the number of distinct simulations run. `progress`: a bar of simulations run
    (tqdm.auto; the probe's policy and rate beside it), and for large points one inside each."""
    from simserve.runner.point import POINT_BAR_MIN_REQUESTS
    for t in targets:
        if {"slo_attainment", "request_goodput", "slo_goodput"} & set(t.metrics) \
                and cfg.slo is None:
            raise SimserveError(f"{cfg.source}: target {t} needs an slo: in the experiment")
    first = validate(cfg)
    point_bar = progress and first is not None and first.num_requests >= POINT_BAR_MIN_REQUESTS
    bar = None
    if progress:
        import sys

        from tqdm.auto import tqdm
        bar = tqdm(desc=f"{cfg.name} bisect", unit="sim", file=sys.stderr, leave=False)
    hardware = resolve_hardware(cfg.hardware)
    cache: dict[tuple, dict] = {}
    rates = cfg.workload.rates
    out = []
    for t in targets:
        for pol in cfg.policies:
            def evaluate(rate: float, pol=pol, t=t) -> float:
                vals = []
                for seed in cfg.workload.seeds:
                    key = (pol.label, rate, seed)
                    if key not in cache:
                        if bar is not None:
                            bar.set_postfix_str(f"{pol.label} {t.metric} rate={rate:.4g} "
                                                f"seed={seed}")
                        cache[key] = run_point(cfg, Point(pol, rate, seed), hardware,
                                               progress=point_bar).summary
                        if bar is not None:
                            bar.update()
                        if log:
                            log(f"  {pol.label} rate={rate:.4g} seed={seed}: "
                                f"{t.metric}={cache[key].get(t.metric, math.nan):.4g}")
                    v = cache[key].get(t.metric)
                    vals.append(math.nan if v is None else float(v))
                for p in t.also:  # `A & B`: a probe where B fails fails (NaN) whatever A is
                    vb = [cache[(pol.label, rate, seed)].get(p.metric) for seed in cfg.workload.seeds]
                    if not p.passes(float(np.mean([math.nan if x is None else x for x in vb]))):
                        return math.nan
                return float(np.mean(vals))
            c = bisect_capacity(evaluate, t, lo=lo, hi=hi, start=(min(rates), max(rates)),
                                rtol=rtol, atol=atol, group={"policy": pol.label})
            out.append(Capacity(c.group, t, c.rate, c.censored, c.lowest_rate, c.highest_rate,
                                "bisect", c.bracket, c.num_simulations * len(cfg.workload.seeds),
                                c.probes))
    if bar is not None:
        bar.close()
    return out, len(cache)
