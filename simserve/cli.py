"""simserve: simulate LLM serving designs on fitted hardware profiles.

Each sub-command lives next to the code it drives and registers itself through a
`register(subparsers)` function listed in COMMAND_MODULES; handlers return an exit code."""
from __future__ import annotations

import argparse
import importlib
import sys

from simserve.errors import SimserveError

# modules that expose register(subparsers); each adds its own sub-command(s)
COMMAND_MODULES = (
    "simserve.runner.cli",
    "simserve.runner.sweep_cli",
    "simserve.workload.cli",
    "simserve.profiles_cli",
    "simserve.calibrate.cli",
    "simserve.runner.capacity_cli",
    "simserve.runner.plot_cli",
    "simserve.runner.regress_cli",
    "simserve.realcheck.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simserve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except SimserveError as exc:
        print(f"simserve: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("simserve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
