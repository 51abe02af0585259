"""`simserve traces list | fetch | stats`."""
from __future__ import annotations

import argparse

from simserve.errors import SimserveError
from simserve.workload.build import load_trace
from simserve.workload.manifest import (cache_dir, fetch_trace, find_local, load_manifest,
                                        resolve_trace, trace_dirs)
from simserve.workload.stats import format_stats, trace_stats
from simserve.workload.synthetic import SYNTHETIC
from simserve.workload.transform import first_n


def _list(args: argparse.Namespace) -> int:
    manifest = load_manifest()
    width = max(len(n) for n in manifest)
    for name, e in manifest.items():
        found = find_local(e)
        where = str(found) if found else f"missing (simserve traces fetch {name})"
        reqs = f"{e.requests:,}" if e.requests else "?"
        print(f"{name:<{width}}  {e.format:<14}  {reqs:>7} req  {where}")
    print("searched: " + ", ".join(map(str, trace_dirs())))
    print("synthetic: " + ", ".join(SYNTHETIC))
    return 0


def _fetch(args: argparse.Namespace) -> int:
    path = fetch_trace(args.name, args.dest)
    print(f"{args.name}: {path} (sha256 verified)")
    return 0


SYNTHETIC_STATS_REQUESTS = 2000  # the quickstart's count, when --first is not given


def _stats(args: argparse.Namespace) -> int:
    from simserve.workload.build import RANDOM, build_workload
    if args.trace in SYNTHETIC or args.trace == RANDOM:  # names `simserve run` accepts too
        n = SYNTHETIC_STATS_REQUESTS if args.first is None else args.first
        w = build_workload(args.trace, num_requests=n, arrival="poisson", rate=args.rate,
                           seed=0)
        print(f"{args.trace}: synthetic, {n} requests generated (seed 0, poisson arrivals at "
              f"{args.rate:g} req/s; --first N, --rate R)")
    else:
        if args.rate != 1.0:
            raise SimserveError("--rate: only for a synthetic workload (a trace file has its "
                                "own arrival times)")
        w = load_trace(resolve_trace(args.trace, also_known=(*SYNTHETIC, RANDOM)))
        if args.first is not None:
            w = first_n(w, args.first)
    print(format_stats({**trace_stats(w), "name": args.trace}))
    return 0


def register(subparsers) -> None:
    """Add `traces` and its sub-commands to the main parser's subparsers."""
    p = subparsers.add_parser("traces", help="list, fetch and summarise request traces",
                              description=__doc__)
    sub = p.add_subparsers(dest="traces_command", metavar="ACTION")
    sub.required = True
    ls = sub.add_parser("list", help="manifest traces and whether each is found locally")
    ls.set_defaults(handler=_list)
    fe = sub.add_parser("fetch", help="download a manifest trace and verify its sha256")
    fe.add_argument("name", metavar="NAME")
    fe.add_argument("--dest", metavar="DIR", default=None,
                    help=f"directory to store it in (default: {cache_dir()})")
    fe.set_defaults(handler=_fetch)
    st = sub.add_parser("stats", help="request count, length percentiles, duration, rate")
    st.add_argument("trace", metavar="FILE_OR_NAME")
    st.add_argument("--first", metavar="N", type=int, default=None,
                    help="only the first N requests (a synthetic workload: N generated, "
                         f"default {SYNTHETIC_STATS_REQUESTS})")
    st.add_argument("--rate", metavar="R", type=float, default=1.0,
                    help="a synthetic workload's arrival rate in req/s (default 1)")
    st.set_defaults(handler=_stats)
