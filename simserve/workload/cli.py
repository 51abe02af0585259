"""`simserve traces list | fetch | stats`."""
from __future__ import annotations

import argparse

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


def _stats(args: argparse.Namespace) -> int:
    w = load_trace(resolve_trace(args.trace))
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
                    help="only the first N requests")
    st.set_defaults(handler=_stats)
