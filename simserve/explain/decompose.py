"""A design's goodput lead over a baseline, decomposed into its mechanisms.

Goodput is a sustainable rate (`simserve.capacity.bisect_capacity` on `run_point`, seeds
averaged): by default the highest rate meeting 95 % SLO attainment while keeping up with the
offered work (`capacity.SUSTAINED_GOODPUT`, the papers' goodput). With G(design), G(baseline)
and G(design with mechanisms 1..i off) = G_i:

    lead = G_0 / G_B = (G_0 / G_1)(G_1 / G_2) ... (G_{k-1} / G_k) · (G_k / G_B)

so the cumulative shares (each mechanism removed on top of the ones before it, in table
order, as the papers' ablation figures remove them) and the remainder (the design with every
mechanism off against the baseline) multiply to the lead exactly. The one-at-a-time shares
G_0 / G_{-i} are printed beside them; their product differs from G_0 / G_k by the interaction
residual.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simserve.capacity import (
    SUSTAINED_GOODPUT,
    Capacity,
    Target,
    bisect_capacity,
    parse_target,
)
from simserve.errors import SimserveError, did_you_mean
from simserve.explain.mechanisms import (
    COLLECTIVES,
    SENSITIVITY,
    Mechanism,
    mechanisms_of,
    option_names,
)


@dataclass
class Goodput:
    """One policy variant's sustainable rate and the counters of its highest passing probe."""
    label: str
    off: dict
    capacity: Capacity
    counters: dict
    num_simulations: int

    @property
    def rate(self) -> float:
        c = self.capacity
        return math.nan if c.censored else float(c.rate)


@dataclass
class Row:
    """One mechanism: its goodput off alone and off on top of the ones before it."""
    mechanism: Mechanism
    available: bool
    alone: Goodput | None = None
    cumulative: Goodput | None = None
    alone_share: float = math.nan        # G_0 / G_{-i}
    cumulative_share: float = math.nan   # G_{i-1} / G_i
    engaged: bool | None = None
    engaged_text: str = ""


@dataclass
class Explanation:
    experiment: str
    design: str
    baseline: str
    target: Target
    design_goodput: Goodput
    baseline_goodput: Goodput
    rows: list[Row]
    remainder: float                     # G_k / G_B
    interaction: float                   # (G_0 / G_k) / Π one-at-a-time shares
    sensitivity: list[dict] | None = None   # None: not asked for
    num_requests: int | None = None
    rtol: float = 0.05
    seconds: float = 0.0
    load: tuple = ()
    num_simulations: int = 0

    @property
    def lead(self) -> float:
        return self.design_goodput.rate / self.baseline_goodput.rate

    @property
    def product(self) -> float:
        """Π cumulative shares × remainder: equals `lead` up to rounding."""
        p = self.remainder
        for r in self.rows:
            if r.available:
                p *= r.cumulative_share
        return p

    def text(self) -> str:
        """The table `simserve explain` prints (`report.text`)."""
        from simserve.explain.report import text
        return text(self)

    @property
    def never_engaged(self) -> list[str]:
        return [f"{r.mechanism.title} never engaged ({r.engaged_text})" for r in self.rows
                if r.available and r.engaged is False]


class _Runner:
    """Runs and caches the probes of every variant of one experiment."""

    def __init__(self, cfg, target: Target, rtol: float, log: Callable | None):
        from simserve.hardware.setup import resolve_hardware
        self.cfg, self.target, self.rtol, self.log = cfg, target, rtol, log
        self.hardware = resolve_hardware(cfg.hardware)
        self.num_simulations = 0

    def goodput(self, spec, off: dict, start: tuple[float, float], hardware=None) -> Goodput:
        from simserve.runner.point import Point, run_point
        cfg, t = self.cfg, self.target
        hw = self.hardware if hardware is None else hardware
        if off:
            conf = dataclasses.replace(spec.config, **off)
            conf.validate()
            tag = ",".join(f"{k}={v}" for k, v in off.items())
            spec = dataclasses.replace(spec, config=conf, label=f"{spec.label}|{tag}")
        summaries: dict[float, list[dict]] = {}

        def evaluate(rate: float) -> float:
            runs = [run_point(cfg, Point(spec, rate, seed), hw).summary
                    for seed in cfg.workload.seeds]
            self.num_simulations += len(runs)
            summaries[rate] = runs
            out = []
            for p in t.parts:
                vals = [math.nan if s.get(p.metric) is None else float(s[p.metric]) for s in runs]
                out.append((p, float(np.mean(vals))))
            if not all(p.passes(v) for p, v in out[1:]):
                return math.nan
            v = out[0][1]
            if self.log:
                self.log(f"  {spec.label} rate={rate:.4g}: {t.metric}={v:.4g}")
            return v

        cap = bisect_capacity(evaluate, t, start=start, rtol=self.rtol,
                              group={"policy": spec.label})
        passing = [r for r, v in cap.probes if t.passes(v)]
        counters = summaries[max(passing)][0].get("counters") or {} if passing else {}
        return Goodput(spec.label, dict(off), cap, counters, len(cap.probes))


def _spec(cfg, label: str, role: str):
    for p in cfg.policies:
        if p.label == label:
            return p
    labels = [p.label for p in cfg.policies]
    raise SimserveError(f"{cfg.source}: --{role} {label!r}: no policy with that label"
                        f"{did_you_mean(label, labels)}; labels: {', '.join(labels)}")


def _default_target(cfg) -> Target:
    if cfg.slo is None:
        raise SimserveError(f"{cfg.source}: explain needs an slo: in the experiment, or "
                            "--target (e.g. 'mean_normalized_latency_s<=1')")
    return parse_target(SUSTAINED_GOODPUT)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and math.isfinite(a) and math.isfinite(b) else math.nan


def explain_config(cfg, design: str, baseline: str, *, mechanisms=None,
                   target: Target | str | None = None, rtol: float = 0.05,
                   sensitivity: bool = False, log: Callable | None = None) -> Explanation:
    """`explain` on a parsed experiment (`runner.config.ExperimentConfig`)."""
    t0, load0 = time.time(), os.getloadavg()
    tgt = _default_target(cfg) if target is None else (
        parse_target(target) if isinstance(target, str) else target)
    dspec, bspec = _spec(cfg, design, "design"), _spec(cfg, baseline, "baseline")
    mechs = mechanisms_of(dspec.name)
    if not mechs:
        raise SimserveError(f"--design {design!r}: policy {dspec.name!r} has no registered "
                            "mechanisms (simserve.explain.mechanisms.MECHANISMS: "
                            f"{', '.join(_known())})")
    if mechanisms:
        keys = [m.key for m in mechs]
        bad = [k for k in mechanisms if k not in keys]
        if bad:
            raise SimserveError(f"--mechanisms {bad[0]!r}: not a mechanism of {dspec.name}"
                                f"{did_you_mean(bad[0], keys)}; mechanisms: {', '.join(keys)}")
        by_key = {m.key: m for m in mechs}
        mechs = tuple(by_key[k] for k in dict.fromkeys(mechanisms))   # in the order given
    opts = option_names(dspec.name)
    run = _Runner(cfg, tgt, rtol, log)
    start = (min(cfg.workload.rates), max(cfg.workload.rates))
    g_d = run.goodput(dspec, {}, start)
    g_b = run.goodput(bspec, {}, start)
    # every bisection starts from the same bracket, so all probe the same grid of rates and
    # their goodputs differ only where the runs do (not by the path the search took)
    near = start
    design_opts = dataclasses.asdict(dspec.config)
    rows: list[Row] = []
    off_so_far: dict = {}
    prev = g_d
    for m in mechs:
        ok = set(m.off) <= opts
        row = Row(m, ok)
        rows.append(row)
        if not ok:
            row.engaged_text = (f"policy {dspec.name} has no option "
                                f"{', '.join(sorted(set(m.off) - opts))} yet")
            continue
        row.engaged, row.engaged_text = m.engaged(g_d.counters, design_opts)
        row.alone = run.goodput(dspec, m.off, near)
        row.alone_share = _ratio(g_d.rate, row.alone.rate)
        off_so_far = {**off_so_far, **m.off}
        row.cumulative = row.alone if len(off_so_far) == len(m.off) else \
            run.goodput(dspec, off_so_far, near)
        row.cumulative_share = _ratio(prev.rate, row.cumulative.rate)
        prev = row.cumulative
    remainder = _ratio(prev.rate, g_b.rate)
    alone = [r.alone_share for r in rows if r.available]
    interaction = _ratio(_ratio(g_d.rate, prev.rate), float(np.prod(alone)) if alone else 1.0)
    ex = Explanation(cfg.name, design, baseline, tgt, g_d, g_b, rows, remainder, interaction,
                     num_requests=cfg.workload.num_requests, rtol=rtol)
    if sensitivity:
        ex.sensitivity = _sensitivity(run, dspec, bspec, near, g_b)
        if not ex.sensitivity:
            ex.sensitivity = [dict(variation="(none)", available=False,
                                   note=f"no sensitivity variations are registered for "
                                        f"policy {dspec.name} (mechanisms.SENSITIVITY)")]
    ex.seconds = time.time() - t0
    ex.load = (load0, os.getloadavg())
    ex.num_simulations = run.num_simulations
    return ex


def _sensitivity(run: _Runner, dspec, bspec, near, g_b: Goodput) -> list[dict]:
    """The headline ratio with each SENSITIVITY override applied to every run whose policy has
    the options (a baseline without them keeps its goodput)."""
    out = []
    for label, over in _measured_range(run.hardware, dspec.name) + \
            SENSITIVITY.get(dspec.name, ()):
        if COLLECTIVES in over:
            from simserve.hardware.collective_band import hardware_at
            hw = hardware_at(run.hardware, over[COLLECTIVES])
            gd = run.goodput(dspec, {}, near, hw).rate
            gb = run.goodput(bspec, {}, near, hw).rate
            out.append(dict(variation=label, available=True, design_goodput=gd,
                            baseline_goodput=gb, ratio=_ratio(gd, gb)))
            continue
        have_d = set(over) <= option_names(dspec.name)
        have_b = set(over) <= option_names(bspec.name)
        if not have_d and not have_b:
            out.append(dict(variation=label, available=False, note="no policy here has "
                            f"option {', '.join(over)} (not exposed yet)"))
            continue
        gd = run.goodput(dspec, over, near).rate if have_d else math.nan
        gb = run.goodput(bspec, over, near).rate if have_b else g_b.rate
        out.append(dict(variation=label, available=True, design_goodput=gd,
                        baseline_goodput=gb, ratio=_ratio(gd, gb)))
    return out


def _measured_range(hardware, policy: str) -> tuple:
    """The GPU profile's measured contention range (`overheads.sp_contention`'s `alpha_range`,
    `beta_range`), both edges, for a policy with `alpha` and `beta` options."""
    sp = (getattr(hardware.gpu, "overheads", None) or {}).get("sp_contention") or {}
    a, b = sp.get("alpha_range"), sp.get("beta_range")
    if not (a and b) or not {"alpha", "beta"} <= option_names(policy):
        return ()
    return tuple((f"alpha={x:g}, beta={y:g} ({edge} edge of the profile's measured range)",
                  {"alpha": float(x), "beta": float(y)})
                 for edge, x, y in (("low", a[0], b[0]), ("high", a[1], b[1])))


def _known() -> list[str]:
    from simserve.explain.mechanisms import MECHANISMS
    return sorted(MECHANISMS)
