"""`simserve cache info | clear`: the disk cache of parsed profiles and traces
(`simserve.parsed_cache`)."""
from __future__ import annotations

import argparse

from simserve import parsed_cache


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _info(args: argparse.Namespace) -> int:
    found = parsed_cache.entries()
    total = sum(size for _, size, _ in found)
    state = "on" if parsed_cache.enabled() else "off (SIMSERVE_PARSE_CACHE=0)"
    print(f"parse cache: {parsed_cache.cache_folder()} ({state})")
    print(f"{len(found)} entries, {_mb(total)} of at most {_mb(parsed_cache.max_bytes())} "
          "(SIMSERVE_PARSE_CACHE_MAX_MB; least recently used entries go first)")
    return 0


def _clear(args: argparse.Namespace) -> int:
    n, freed = parsed_cache.clear()
    print(f"removed {n} file(s), {_mb(freed)} from {parsed_cache.cache_folder()}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("cache", help="the disk cache of parsed profiles and traces: info, clear",
                       description="Parsed hardware profiles and trace files are cached on "
                       "disk, keyed by the file's content and the reader's code, and pruned to "
                       "a size cap (SIMSERVE_PARSE_CACHE_MAX_MB).")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    csub.required = True
    csub.add_parser("info", help="where the cache is, its size and cap").set_defaults(
        handler=_info)
    csub.add_parser("clear", help="remove every cached entry").set_defaults(handler=_clear)
