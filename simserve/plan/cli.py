"""`simserve plan FILE [--out DIR] [--executor local|dask|ray] [--workers N]`."""
from __future__ import annotations

import sys
from pathlib import Path

HELP = "the cheapest deployment (GPUs, design, knobs, router) that meets an SLO"


def register(sub) -> None:
    from simserve.runner.executors import EXECUTORS
    p = sub.add_parser("plan", help=HELP,
                       description="Expand a plan YAML's candidates (GPU kinds and counts, host "
                       "CPUs, designs and knobs, routers), prune what cannot fit, rank the rest "
                       "with an analytical screen, simulate the frontier with capacity "
                       "bisection and print the ranked table; resumable with --out.")
    p.add_argument("file", help="plan YAML (docs/how-to/plan-a-deployment.md)")
    p.add_argument("--out", help="folder for plan.csv, plan.json, winner.yaml, pareto.png and "
                   "the state file a rerun resumes from (default results/NAME-plan)")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="where bisections run: local processes (default), Dask or Ray")
    p.add_argument("--workers", type=int, help="parallel bisections (default all cores)")
    p.add_argument("--rows", type=int, default=20, help="table rows to print (default 20)")
    p.add_argument("--screen-only", action="store_true",
                   help="rank every candidate with the analytical screen and simulate none")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=_plan)


def _plan(args) -> int:
    from simserve.plan import load_plan, plan
    spec = load_plan(args.file)
    out = Path(args.out) if args.out else Path("results") / f"{spec.name}-plan"
    res = plan(spec, out=out, executor=args.executor, workers=args.workers,
               progress=not args.quiet, simulate=not args.screen_only)
    print(res.table(args.rows))
    print(res.summary())
    if res.winner is not None:
        flags = res.vllm_flags()
        print(f"winner's experiment: {out / 'winner.yaml'} (simserve run {out / 'winner.yaml'})")
        if flags:
            print(flags)
    print(f"prices: {res.prices.name if res.prices else '-'}; table, Pareto plot and state in "
          f"{out}", file=sys.stderr)
    return 0
