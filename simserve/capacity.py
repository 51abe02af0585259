"""Capacity: the highest request rate at which a policy still meets a target.

A target bounds one summary metric: `p99_ttft_ms<=5000` (a metric that worsens as the rate
grows) or `slo_attainment>=0.95` (one that falls). Two ways to find the rate:

- `grid_capacity(records, targets)`: from a measured rate grid (a results folder's
  `summary.json`), seeds averaged per rate, linear interpolation between measured points via
  `metrics.sustainable_rate` / `metrics.max_rate_meeting`; never extrapolated, censored when
  the curve does not cross.
- `bisect_capacity(evaluate, target, ...)`: adaptive bisection on the rate to a tolerance, with
  any `evaluate(rate) -> value`; `simserve.runner.bisect.bisect_experiment(cfg, targets)`
  wires it to `run_point`.

Both return `Capacity` values; `simserve.runner.capacity_cli` prints them as tables.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from simserve.errors import SimserveError, did_you_mean
from simserve.metrics import (SLO, first_failure, max_rate_meeting, summarize,
                              sustainable_rate)
from simserve.strict_json import from_strict_json


def _metric_keys() -> tuple[str, ...]:
    """Every key `summarize` writes (with an SLO), plus the runner's per-point counts."""
    from simserve.sim.records import RequestRecords
    z, i = np.zeros(0), np.zeros(0, dtype=np.int64)
    empty = RequestRecords(z, i, i, z, z, np.zeros(1, dtype=np.int64), z, i)
    return ("num_requests", "num_capped", "num_dropped", "prefix_cache_hit_rate",
            "prefix_cache_saved_tokens", *summarize(empty, SLO(1, 1)))  # per-token form


METRIC_KEYS = _metric_keys()
# identify a point, not a curve (a sweep may also name the rate and seed by their config keys)
ID_KEYS = ("request_rate", "seed", "point", "workload.rates", "workload.rate", "workload.seeds",
           "workload.seed",
           # what every record says about its run (curves are named by policy and swept keys)
           "date", "model", "gpu", "num_gpus", "policy_name", "policy_options",
           "counters")   # a CPU-tier policy's mechanism counts differ per point
HIGHER_IS_BETTER = ("slo_attainment", "keep_up_ratio")  # fall as the rate grows: targets use >=
# The goodput the paper tables use: 95 % attainment AND keeping up with the offered work
# (docs/metrics.md, "Sustained goodput"); plain 95 % attainment is reported beside it.
SUSTAINED_GOODPUT = "slo_attainment>=0.95 & keep_up_ratio>=0.95"
# DualPace's four latency targets (§6.1) and ConfluxServe's 95 % attainment, plain and sustained.
DEFAULT_TARGETS = ("mean_normalized_latency_s<=1", "p99_ttft_ms<=5000", "p99_itl_ms<=1500",
                   "p99_tpot_ms<=1500", "slo_attainment>=0.95", SUSTAINED_GOODPUT)


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True, slots=True)
class Target:
    metric: str
    op: str  # "<=" or ">="
    value: float
    also: tuple = ()  # further Targets that must hold too (`A & B`): capacity = first failure

    def passes(self, v: float) -> bool:
        """NaN (nothing measurable) never passes."""
        return bool(v <= self.value) if self.op == "<=" else bool(v >= self.value)

    @property
    def parts(self) -> tuple:
        return (Target(self.metric, self.op, self.value),) + tuple(self.also)

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(p.metric for p in self.parts)

    def __str__(self) -> str:
        return " & ".join(f"{p.metric} {p.op} {p.value:g}" for p in self.parts)


_TARGET_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|=<|=>|<|>|==|=)\s*(\S+?)\s*$")


def parse_target(expr: str) -> Target:
    """`METRIC<=VALUE` or `METRIC>=VALUE` on a summary key; attainment may be written `95%`.
    `A & B` holds where both hold (e.g. the sustained goodput, `SUSTAINED_GOODPUT`)."""
    if "&" in str(expr):
        parts = [parse_target(x) for x in str(expr).split("&")]
        return Target(parts[0].metric, parts[0].op, parts[0].value, tuple(parts[1:]))
    m = _TARGET_RE.match(str(expr))
    if not m:
        raise SimserveError(f"--target {expr!r}: expected METRIC<=VALUE or METRIC>=VALUE, e.g. "
                            "p99_ttft_ms<=5000 or slo_attainment>=0.95")
    metric, op, raw = m.groups()
    if metric not in METRIC_KEYS:
        raise SimserveError(f"--target {expr!r}: unknown metric {metric!r}"
                            f"{did_you_mean(metric, METRIC_KEYS)}; metrics are the keys of "
                            "summary.json, e.g. mean_normalized_latency_s, p99_ttft_ms, "
                            "p99_itl_ms, p99_tpot_ms, slo_attainment")
    if op not in ("<=", ">="):
        raise SimserveError(f"--target {expr!r}: operator {op!r}: use <= or >=")
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise SimserveError(f"--target {expr!r}: value {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SimserveError(f"--target {expr!r}: value must be finite")
    rising = metric not in HIGHER_IS_BETTER
    if rising and op != "<=":
        raise SimserveError(f"--target {expr!r}: {metric} grows with the request rate, so a "
                            f"capacity target bounds it from above: {metric}<={raw}")
    if not rising and op != ">=":
        raise SimserveError(f"--target {expr!r}: {metric} falls as the request rate grows, so "
                            f"a capacity target bounds it from below: {metric}>={raw}")
    if metric in HIGHER_IS_BETTER and not 0 < value <= 1:
        raise SimserveError(f"--target {expr!r}: {metric} is a fraction in (0, 1] "
                            "(0.95, or 95%)")
    return Target(metric, op, value)


# --------------------------------------------------------------------------- records


def load_records(path: str | Path) -> list[dict]:
    """The records of a results folder (its summary.json) or of a summary.json file: a JSON
    list of records, or one JSON object per line (`simserve run --summary-format vllm`, as
    `vllm bench serve --append-result` writes them)."""
    p = Path(path)
    f = p / "summary.json" if p.is_dir() else p
    if not f.exists():
        hint = " (a results folder needs summary.json)" if p.is_dir() else ""
        raise SimserveError(f"{f}: no such file{hint}")
    try:
        text = f.read_text()
        try:
            recs = json.loads(text)
        except json.JSONDecodeError:
            recs = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SimserveError(f"{f}: not a JSON summary: {exc}") from None
    if not isinstance(recs, list) or not recs or not all(isinstance(r, dict) for r in recs):
        raise SimserveError(f"{f}: expected a non-empty list of run records")
    for i, r in enumerate(recs):
        for k in ("policy", "request_rate"):
            if k not in r:
                raise SimserveError(f"{f}: record {i} has no {k!r}")
        from_strict_json(r)
    return recs


def group_keys(records: list[dict]) -> list[str]:
    """Fields that name a curve: policy first, then every other field that is neither a metric
    nor an id and is set somewhere (a sweep without variants writes variant: null)."""
    keys: list[str] = []
    for r in records:
        keys += [k for k in r if k not in keys and k not in METRIC_KEYS and k not in ID_KEYS
                 and r[k] is not None]
    return ["policy"] + [k for k in keys if k != "policy"]


def _hashable(v):
    if isinstance(v, (str, int, float, bool, type(None))):
        return v
    return json.dumps(v, sort_keys=True)


def group_records(records: list[dict]) -> list[tuple[dict, list[dict]]]:
    """Records grouped into curves, in order of first appearance (the first is the baseline)."""
    keys = group_keys(records)
    groups: dict[tuple, tuple[dict, list]] = {}
    for r in records:
        gid = tuple(_hashable(r.get(k)) for k in keys)
        if gid not in groups:
            groups[gid] = ({k: r.get(k) for k in keys if k in r}, [])
        groups[gid][1].append(r)
    return list(groups.values())


def group_label(group: dict) -> str:
    """'vllm · variant=h200 · max_num_batched_tokens=512' (a dotted key by its last part)."""
    rest = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in group.items() if k != "policy"]
    return " · ".join([str(group.get("policy"))] + rest)


@dataclass
class Curve:
    """One metric against the rate for one group; `values` is the mean over seeds."""
    group: dict
    metric: str
    rates: np.ndarray
    values: np.ndarray
    vmin: np.ndarray
    vmax: np.ndarray
    num_seeds: int

    @property
    def label(self) -> str:
        return group_label(self.group)


def as_records(records) -> list[dict]:
    """Run records from a list of dicts, or from the DataFrame `simserve.run_experiment` or
    `simserve.load_results` returns (a field a row lacks reads as absent, not as NaN; metric
    values stay NaN where nothing was measurable)."""
    if hasattr(records, "to_dict"):
        rows = records.to_dict("records")
        return [{k: v for k, v in r.items()
                 if k in METRIC_KEYS or not (isinstance(v, float) and v != v)} for r in rows]
    if isinstance(records, (str, bytes)) or not all(isinstance(r, dict) for r in records):
        raise SimserveError("records: expected run records (a list of dicts or the DataFrame "
                            "run_experiment returns)")
    return list(records)


def rate_curves(records: list[dict], metric: str) -> list[Curve]:
    """Per group: the metric at each measured rate, averaged over seeds (NaN if any seed is
    NaN: a seed where nothing was measurable counts as failing)."""
    records = as_records(records)
    if not any(metric in r for r in records):
        extra = (" (the experiment has no slo:, so nothing measured attainment)"
                 if metric in ("slo_attainment", "request_goodput", "slo_goodput") else "")
        raise SimserveError(f"{metric}: not in these results{extra}")
    out = []
    for group, recs in group_records(records):
        by_rate: dict[float, list[float]] = {}
        for r in recs:
            v = r.get(metric)
            by_rate.setdefault(float(r["request_rate"]), []).append(
                math.nan if v is None else float(v))
        rates = np.array(sorted(by_rate))
        vals = [np.asarray(by_rate[x]) for x in rates]
        out.append(Curve(group, metric, rates, np.array([v.mean() for v in vals]),
                         np.array([v.min() for v in vals]), np.array([v.max() for v in vals]),
                         max(len(v) for v in vals)))
    return out


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Capacity:
    """The sustainable rate of one group for one target.

    censored with a finite rate: at least `rate` (the curve never crossed); censored with NaN:
    below `lowest_rate` (even it failed). `bracket` (bisection only) holds [passing, failing]."""
    group: dict
    target: Target
    rate: float
    censored: bool
    lowest_rate: float
    highest_rate: float
    method: str = "grid"
    bracket: tuple[float, float] | None = None
    num_simulations: int | None = None
    probes: tuple = field(default=(), repr=False)  # (rate, value) in probe order

    @property
    def bounds(self) -> tuple[float, float]:
        """What is known about the rate as an interval (exact: [r, r])."""
        if not self.censored:
            return self.rate, self.rate
        if math.isnan(self.rate):
            return 0.0, self.lowest_rate
        return self.rate, math.inf

    @property
    def text(self) -> str:
        lo, hi = self.bounds
        if lo == hi:  # a bisected rate as precisely as its bracket is printed
            return f"{lo:.4g}" if self.method == "bisect" else f"{lo:.3g}"
        return f"< {hi:.3g}" if lo == 0 else f"≥ {lo:.3g}"

    @property
    def censored_text(self) -> str:
        if not self.censored:
            return "no"
        return "yes, low" if math.isnan(self.rate) else "yes, high"


def capacity_from_curve(rates, values, target: Target) -> tuple[float, bool]:
    if target.op == "<=":
        return sustainable_rate(rates, values, target.value)
    return max_rate_meeting(rates, values, target.value)


def grid_capacity(records: list[dict], targets: list[Target]) -> list[Capacity]:
    """For each target, each group's sustainable rate from its measured (seed-mean) curve; for
    `A & B`, the first rate where either fails (`metrics.first_failure`). `records`: a list
    of dicts or the DataFrame `run_experiment` returns; a target may be written as text,
    "p99_ttft_ms<=500"."""
    records = as_records(records)
    targets = [parse_target(t) if isinstance(t, str) else t for t in targets]
    out = []
    for t in targets:
        curves = [rate_curves(records, p.metric) for p in t.parts]
        for cs in zip(*curves):
            c = cs[0]
            rate, cens = first_failure([capacity_from_curve(x.rates, x.values, p)
                                        for x, p in zip(cs, t.parts)])
            out.append(Capacity(c.group, t, rate, cens, float(c.rates[0]), float(c.rates[-1])))
    return out


# --------------------------------------------------------------------------- bisection


def bisect_capacity(evaluate: Callable[[float], float], target: Target, *,
                    lo: float | None = None, hi: float | None = None,
                    start: tuple[float, float] = (1.0, 2.0), rtol: float = 0.02,
                    atol: float | None = None, max_expand: int = 10, max_probes: int = 80,
                    group: dict | None = None) -> Capacity:
    """Bisection on the rate, assuming the metric gets worse as the rate grows.

    Bracket: `lo` must pass and `hi` fail; a missing end is found by doubling up (halving down)
    from `start` (the experiment's lowest and highest rates) at most `max_expand` times; an end
    the caller gave is never moved, so the answer is then censored as on a grid. Bisects until
    hi - lo <= rtol·lo (or <= atol). The rate is the linear interpolation between the final
    bracket's two ends, so it lies inside the bracket.
    """
    for name, v in (("lo", lo), ("hi", hi)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise SimserveError(f"--{name}: expected a positive rate, got {v!r}")
    if lo is not None and hi is not None and not lo < hi:
        raise SimserveError(f"--lo {lo:g} --hi {hi:g}: expected lo < hi")
    if not rtol >= 0 or (atol is not None and not atol > 0) or (rtol == 0 and atol is None):
        raise SimserveError("--tol: expected a positive relative tolerance (or --abs-tol)")
    probes: list[tuple[float, float]] = []

    def ok(r: float) -> bool:
        if len(probes) >= max_probes:
            raise SimserveError(f"{target}: bisection did not converge in {max_probes} probes")
        v = float(evaluate(r))
        probes.append((r, v))
        return target.passes(v)

    def done(rate, censored, a=None, b=None):
        rs = [p[0] for p in probes]
        return Capacity(group or {}, target, rate, censored, min(rs), max(rs), "bisect",
                        None if a is None else (a, b), len(probes), tuple(probes))

    # the lower end must pass: halve down from the start unless the caller fixed it
    a = lo if lo is not None else (start[0] if hi is None or start[0] < hi else hi / 2)
    b = None  # a rate known to fail
    if not ok(a):
        if lo is not None:
            return done(math.nan, True)
        for _ in range(max_expand):
            a, b = a / 2, a
            if ok(a):
                break
        else:
            return done(math.nan, True)
    # the upper end must fail: double up unless the caller fixed it
    if b is None:
        b = hi if hi is not None else (start[1] if start[1] > a else 2 * a)
        for i in range(max_expand + 1):
            if not ok(b):
                break
            if hi is not None or i == max_expand:
                return done(b, True)
            a, b = b, 2 * b
    tol = max(rtol * a, atol or 0.0)
    while b - a > tol:
        m = 0.5 * (a + b)
        if ok(m):
            a = m
        else:
            b = m
        tol = max(rtol * a, atol or 0.0)
    va, vb = dict(probes)[a], dict(probes)[b]
    rate = a
    if math.isfinite(vb) and vb != va:  # interpolate inside the final bracket
        rate = float(np.clip(a + (target.value - va) * (b - a) / (vb - va), a, b))
    return done(rate, False, a, b)
