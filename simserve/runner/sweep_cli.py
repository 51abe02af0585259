"""`simserve sweep FILE [--out DIR] [--dry-run] [--executor local|dask|ray] [--workers N]
[--scheduler ADDRESS] [--address ADDRESS] [--set KEY=VALUE ...]`."""
from __future__ import annotations

import argparse
from pathlib import Path

from simserve.runner.executors import EXECUTORS
from simserve.runner.point import TABLE_COLUMNS, table_footer
from simserve.runner.storage import os_error
from simserve.runner.sweep import check_points, load_sweep
from simserve.runner.sweep_run import check_sweep_out, point_status, run_sweep

MAX_TABLE_ROWS = 200


def _fmt(v, fmt) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if fmt == "s":
        return f"{v / 1000:.3f}"
    return fmt.format(v) if fmt else str(v)


def table(rows: list[dict], columns: list[tuple[str, str, str | None]]) -> str:
    cells = [[h for _, h, _ in columns]]
    cells += [[_fmt(r.get(k), f) for k, _, f in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _sims(n_points: int, n_sims: int) -> str:
    return "" if n_points == n_sims else f" ({n_sims} distinct simulations)"


def _ident_columns(sweep) -> list:
    cols = [("variant", "variant", None)] if sweep.variants else []
    return cols + [(k, k, None) for k in sweep.axes]


def _sweep(args: argparse.Namespace) -> int:
    try:
        return _sweep_checked(args)
    except OSError as exc:  # reading a stored point for --dry-run, say
        raise os_error(args.out or "results", exc) from None


def _sweep_checked(args: argparse.Namespace) -> int:
    sweep = load_sweep(args.file, args.set or [])
    out = Path(args.out) if args.out else Path("results") / f"{sweep.name}-sweep"
    check_sweep_out(out, args.overwrite, args.adopt or args.reuse_stale)
    if args.dry_run:
        check_points(sweep)
        status = point_status(sweep, out) if not args.overwrite else ["todo"] * len(sweep.points)
        rows = [{**sp.ident(), "policy": sp.policy, "request_rate": sp.rate, "seed": sp.seed,
                 "status": st} for sp, st in zip(sweep.points, status)]
        cols = [("point", "point", None), ("status", "status", None)] + _ident_columns(sweep) + \
            [("policy", "policy", None), ("request_rate", "rate", "{:g}"), ("seed", "seed", None)]
        print(table(rows, cols))
        n_sim = len(sweep.unique())
        n_done = len({sp.key for sp, st in zip(sweep.points, status) if st == "done"})
        n_stale = len({sp.key for sp, st in zip(sweep.points, status) if st == "stale"})
        print(f"\n{len(rows)} points{_sims(len(rows), n_sim)}: {n_done} done, "
              f"{n_sim - n_done} to run" + (f" ({n_stale} stale: stored from other inputs)"
                                            if n_stale else "")
              + f"; results would go to {out}/")
        return 0
    res = run_sweep(sweep, out, executor=args.executor, workers=args.workers,
                    scheduler=args.scheduler, address=args.address, progress=not args.quiet,
                    overwrite=args.overwrite, reuse_stale=args.reuse_stale, adopt=args.adopt)
    if len(res.records) <= MAX_TABLE_ROWS:
        cols = _ident_columns(sweep) + [c for c in TABLE_COLUMNS
                                        if any(r.get(c[0]) is not None for r in res.records)]
        print(f"{sweep.name}: times in seconds")
        print(table(res.records, cols))
        slos = {sp.cfg.slo for sp in sweep.points}
        print(table_footer(slos.pop() if len(slos) == 1 else "varies"))
    n = len(res.records)
    print(f"\n{n} points{_sims(n, res.num_run + res.num_skipped)}: {res.num_run} run, "
          f"{res.num_skipped} already done"
          + (f" ({sum(res.stale.values())} stale {'kept' if args.reuse_stale else 'rerun'})"
             if res.stale else "") + f"; results: {out}/ (summary.json, summary.csv, "
          "points/<hash>/)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("sweep", help="run every point of a sweep YAML (resumable)",
                       description="Expand a sweep (an experiment YAML plus `sweep:` and "
                       "`variants:`), run the points not done yet, one folder per point, and "
                       "write summary.json / summary.csv.")
    p.add_argument("file", help="sweep YAML")
    p.add_argument("--out", help="results folder (default results/NAME-sweep)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the points (done or to run) and run nothing")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local process pool (default), a Dask distributed cluster or a Ray "
                        "cluster (docs/how-to/scale-out.md)")
    p.add_argument("--workers", type=int,
                   help="local: processes (default all cores; 1 runs in this process); "
                        "dask without --scheduler: workers of a LocalCluster; ray without "
                        "--address: CPUs of a local Ray instance")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="Dask scheduler address, e.g. tcp://10.0.0.5:8786")
    p.add_argument("--address", metavar="ADDRESS",
                   help="Ray cluster address, e.g. 10.0.0.5:6379, ray://10.0.0.5:10001 or auto")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config value (also sweep.KEY=[...] and "
                        "variants.NAME.KEY=VALUE)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a folder simserve did not make (or a run's), rerunning "
                        "every point; simserve's own files there are replaced, every other "
                        "file is left as it is")
    p.add_argument("--reuse-stale", action="store_true",
                   help="keep stored points made from other inputs (another trace file "
                        "content, simserve version or code) instead of rerunning them; a "
                        "warning says how many and why, and their records carry `stale`; "
                        "also adopts a sweep folder written before simserve's marker")
    p.add_argument("--adopt", action="store_true",
                   help="take over a sweep folder written by a simserve older than its "
                        ".simserve.json marker (recognised by its layout; refused if it holds "
                        "anything else): its points rerun as stale, nothing else is touched")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=_sweep)
