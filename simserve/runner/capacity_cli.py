"""`simserve capacity RESULTS_DIR_OR_FILE --target EXPR [...] [--bisect --tol 0.02 --lo --hi]`."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from simserve.capacity import (DEFAULT_TARGETS, METRIC_KEYS, Capacity, Target, grid_capacity,
                               group_keys, group_records, load_records, parse_target)
from simserve.errors import SimserveError
from simserve.runner.bisect import bisect_experiment


# --------------------------------------------------------------------------- ratios


def ratio_bounds(a: Capacity, b: Capacity) -> tuple[float, float]:
    """What is known about rate(a) / rate(b), from both rates' intervals."""
    (alo, ahi), (blo, bhi) = a.bounds, b.bounds
    lo = alo / bhi if bhi not in (0, math.inf) else 0.0
    hi = ahi / blo if blo > 0 else math.inf
    return lo, hi


def ratio_text(a: Capacity, b: Capacity) -> str:
    if a is b:
        return "1.00"
    lo, hi = ratio_bounds(a, b)
    if lo == hi:
        return f"{lo:.2f}"
    if lo > 0 and math.isinf(hi):
        return f"≥ {lo:.2f}"
    if lo == 0 and math.isfinite(hi):
        return f"≤ {hi:.2f}"
    if lo > 0:
        return f"{lo:.2f}–{hi:.2f}"
    return "?"


def best_of(rows: list[Capacity]) -> Capacity:
    """The group with the highest known lower bound (then the highest upper bound)."""
    return max(rows, key=lambda c: c.bounds)


# --------------------------------------------------------------------------- tables


def _cell(v) -> str:
    return "-" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))


def format_capacity_table(rows: list[Capacity]) -> str:
    """One target's table: a row per group, its rate, censoring and ratios between groups."""
    keys: list[str] = []
    for c in rows:
        keys += [k for k in c.group if k not in keys]
    base, best = rows[0], best_of(rows)
    bisect = rows[0].method == "bisect"
    head = keys + ["sustainable req/s", "censored"]
    head += ["bracket req/s", "sims"] if bisect else ["measured req/s"]
    head += ["vs best", f"vs {base.group['policy']}" if keys == ["policy"] else "vs row 1"]
    table = [head]
    for c in rows:
        row = [_cell(c.group.get(k)) for k in keys] + [c.text, c.censored_text]
        if bisect:
            row += ["-" if c.bracket is None else f"[{c.bracket[0]:.4g}, {c.bracket[1]:.4g}]",
                    str(c.num_simulations)]
        else:
            row += [f"{c.lowest_rate:g}–{c.highest_rate:g}"]
        row += [ratio_text(c, best), ratio_text(c, base)]
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    left = set(range(len(keys))) | {len(keys) + 1}
    lines = ["  ".join(x.ljust(w) if i in left else x.rjust(w)
                       for i, (x, w) in enumerate(zip(r, widths))).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _method_line(t: Target, bisect: bool, rtol, atol) -> str:
    if bisect:
        tol = f"{atol:g} req/s" if atol and not rtol else f"{rtol:.0%}" + (
            f" or {atol:g} req/s" if atol else "")
        return (f"target {t}: adaptive bisection to a bracket within {tol}; the rate is "
                "interpolated inside the final bracket")
    conv = ("first crossing" if t.op == "<=" else
            "first crossing: the highest rate below which it is never missed")
    if t.also:
        conv = "the first rate where any part fails"
    return (f"target {t}: linear interpolation between measured rates ({conv}), "
            "never extrapolated; seeds averaged per rate")


def capacity_json(rows: list[Capacity]) -> list[dict]:
    def num(x):
        return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x
    return [{"target": str(c.target), **c.group, "rate": num(c.rate), "censored": c.censored,
             "lower_bound": num(c.bounds[0]), "upper_bound": num(c.bounds[1]),
             "method": c.method, "bracket": list(c.bracket) if c.bracket else None,
             "num_simulations": c.num_simulations} for c in rows]


# --------------------------------------------------------------------------- command


def _targets(args, available: set[str] | None) -> list[Target]:
    if args.target:
        return [parse_target(t) for t in args.target]
    ts = [parse_target(t) for t in DEFAULT_TARGETS]
    return [t for t in ts if available is None or set(t.metrics) <= available]


def _experiment_path(path: Path) -> Path:
    if path.is_dir():
        cfg = path / "config.yaml"
        if not cfg.exists():
            raise SimserveError(f"{path}: --bisect needs an experiment YAML, or a results folder "
                                "with the config.yaml that `simserve run` writes")
        return cfg
    return path


def _capacity(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():  # a shipped experiment's name, as `simserve run` takes it
        from simserve.runner.config import experiment_path
        path = experiment_path(args.path)
    is_yaml = path.suffix in (".yaml", ".yml")
    if not args.bisect:
        for flag in ("lo", "hi", "abs_tol"):
            if getattr(args, flag) is not None:
                raise SimserveError(f"--{flag.replace('_', '-')}: only with --bisect")
    if args.set and not (args.bisect or is_yaml):
        raise SimserveError("--set: only with an experiment YAML or --bisect")
    say = (lambda s: None) if args.json else print
    if args.bisect:
        from simserve.runner.config import load_experiment
        cfg = load_experiment(_experiment_path(path), args.set or [])
        targets = _targets(args, None if cfg.slo else
                           set(METRIC_KEYS) - {"slo_attainment", "request_goodput", "slo_goodput"})
        log = (lambda s: print(s, file=sys.stderr)) if args.verbose else None
        rtol = args.tol if args.tol is not None else (0.0 if args.abs_tol else 0.02)
        rows, nsim = bisect_experiment(cfg, targets, lo=args.lo, hi=args.hi, rtol=rtol,
                                       atol=args.abs_tol, log=log, progress=not args.json)
        say(f"{cfg.name}: {cfg.model} on {cfg.hardware.num_gpus}x {cfg.hardware.gpu}, "
            f"{cfg.workload.num_requests} requests, {len(cfg.workload.seeds)} seed(s); "
            f"{nsim} simulations in all")
    else:
        rtol = None
        if is_yaml:
            from simserve.runner.config import load_experiment
            from simserve.runner.point import run_experiment_config
            cfg = load_experiment(path, args.set or [])
            say(f"{cfg.name}: running its rate grid ({len(cfg.workload.rates)} rates × "
                f"{len(cfg.policies)} policies × {len(cfg.workload.seeds)} seeds); "
                "use --bisect to search the rate adaptively")
            records = [r.summary for r in run_experiment_config(cfg, progress=not args.json)]
        else:
            records = load_records(path)
        available = {k for r in records for k in r}
        targets = _targets(args, available)
        missing = [str(t) for t in targets if not set(t.metrics) <= available]
        if missing:
            raise SimserveError(f"{path}: no {', '.join(missing)} in these results "
                                "(slo_attainment needs an slo: in the experiment)")
        rows = grid_capacity(records, targets)
        rates = sorted({float(r["request_rate"]) for r in records})
        seeds = {r.get("seed") for r in records}
        say(f"{path}: {len(records)} records, {len(group_records(records))} curve(s) by "
            f"{', '.join(group_keys(records))}; rates {rates[0]:g}–{rates[-1]:g} req/s; "
            f"{len(seeds)} seed(s)")
    if args.json:
        print(json.dumps(capacity_json(rows), indent=1))
        return 0
    for t in targets:
        these = [c for c in rows if c.target == t]
        print()
        print(_method_line(t, args.bisect, rtol, args.abs_tol))
        print(format_capacity_table(these))
    if any(c.censored for c in rows):
        print("\ncensored: high, '≥ r': met at every rate tried, r is a lower bound (try higher "
              "rates); low, '< r': missed even at the lowest rate tried; ratio '?': both "
              "censored")
    return 0


def _positive(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    return v


def register(sub) -> None:
    p = sub.add_parser(
        "capacity", help="highest sustainable request rate per policy for latency/SLO targets",
        description="Sustainable request rate per policy for each target, from a results "
                    "folder's rate grid (linear interpolation, never extrapolated) or by "
                    "adaptive bisection on an experiment (--bisect).")
    p.add_argument("path", metavar="RESULTS_DIR_OR_FILE",
                   help="results folder or summary.json (grid); experiment YAML (runs its grid, "
                        "or bisects with --bisect); a `simserve run` folder also bisects")
    p.add_argument("--target", action="append", metavar="EXPR",
                   help="METRIC<=VALUE or METRIC>=VALUE on a summary key, repeatable, e.g. "
                        "p99_ttft_ms<=5000, mean_normalized_latency_s<=1, slo_attainment>=0.95 "
                        "(default: " + ", ".join(DEFAULT_TARGETS) + ")")
    p.add_argument("--bisect", action="store_true", help="search the rate by bisection")
    p.add_argument("--tol", type=_positive, default=None,
                   help="bisection: stop when the bracket is within this fraction of its lower "
                        "end (default 0.02)")
    p.add_argument("--abs-tol", type=_positive, default=None, metavar="REQ_PER_S",
                   help="bisection: stop when the bracket is this many req/s wide")
    p.add_argument("--lo", type=_positive, help="bisection: lower rate (must pass; kept fixed)")
    p.add_argument("--hi", type=_positive, help="bisection: upper rate (must fail; kept fixed)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override an experiment value, e.g. --set workload.num_requests=500")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="log every bisection probe")
    p.set_defaults(handler=_capacity)
