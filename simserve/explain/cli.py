"""`simserve explain FILE --design LABEL --baseline LABEL [--plot FILE] [--csv FILE] [--json FILE]`."""
from __future__ import annotations

import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("explain", help="decompose a design's goodput lead over a baseline into "
                       "its mechanisms", description=__doc__.splitlines()[0])
    p.add_argument("file", help="experiment YAML (its policies name the design and baseline)")
    p.add_argument("--design", required=True, help="the design's policy label")
    p.add_argument("--baseline", required=True, help="the baseline's policy label")
    p.add_argument("--mechanisms", help="comma-separated subset, in the order to remove them "
                   "(default: every registered mechanism of the design's policy)")
    p.add_argument("--target", help="goodput target (default: 'slo_attainment>=0.95 & "
                   "keep_up_ratio>=0.95'), e.g. 'mean_normalized_latency_s<=1'")
    p.add_argument("--num-requests", type=int, help="requests per simulated point")
    p.add_argument("--rates", help="LO,HI: where the first bisections start (default: the "
                   "experiment's lowest and highest rates)")
    p.add_argument("--tol", type=float, default=0.05, help="bisection's relative tolerance "
                   "(default 0.05)")
    p.add_argument("--sensitivity", action="store_true",
                   help="also the lead under the contention / collective-cost range")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an experiment key (as `simserve run --set`)")
    p.add_argument("--plot", type=Path, help="write the waterfall plot here (.png/.pdf/.svg)")
    p.add_argument("--csv", type=Path, help="write the table as CSV here")
    p.add_argument("--json", type=Path, help="write the whole result as JSON here")
    p.add_argument("--force", action="store_true",
                   help="replace --plot / --csv / --json files that exist")
    p.add_argument("-v", "--verbose", action="store_true", help="log every probe")
    p.set_defaults(handler=run)


def _rates(text: str | None):
    from simserve.errors import SimserveError
    if text is None:
        return None
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise SimserveError(f"--rates {text!r}: expected LO,HI (e.g. 1,8)") from None
    if not 0 < lo < hi:
        raise SimserveError(f"--rates {text!r}: expected 0 < LO < HI")
    return lo, hi


def run(args) -> int:
    from simserve.errors import SimserveError
    from simserve.explain import explain
    from simserve.explain.report import dumps_json, to_csv, waterfall
    for path in (args.plot, args.csv, args.json):
        if path is not None and path.exists() and path.is_dir():
            raise SimserveError(f"{path}: is a directory; give a file name")
        if path is not None and path.exists() and not args.force:
            raise SimserveError(f"{path}: exists; choose another name or pass --force to "
                                "replace it")
        if path is not None and not path.parent.is_dir():
            raise SimserveError(f"{path}: no such directory {path.parent}")
    if args.num_requests is not None and args.num_requests < 1:
        raise SimserveError(f"--num-requests: expected a positive integer, got {args.num_requests}")
    if not args.tol > 0:
        raise SimserveError(f"--tol: expected a positive fraction, got {args.tol}")
    mechs = [m.strip() for m in args.mechanisms.split(",")] if args.mechanisms else None
    log = (lambda s: print(s, file=sys.stderr)) if args.verbose else None
    ex = explain(args.file, args.design, args.baseline, mechanisms=mechs, target=args.target,
                 num_requests=args.num_requests, rates=_rates(args.rates), rtol=args.tol,
                 sensitivity=args.sensitivity, overrides=args.set, log=log)
    print(ex.text())
    if args.csv:
        args.csv.write_text(to_csv(ex))
    if args.json:
        args.json.write_text(dumps_json(ex) + "\n")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        ax = waterfall(ex)
        ax.figure.tight_layout()
        ax.figure.savefig(args.plot, dpi=120)
    return 0
