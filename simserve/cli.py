"""simserve: simulate LLM serving designs on fitted hardware profiles.

Each sub-command lives next to the code it drives and registers itself through a
`register(subparsers)` function in the module COMMANDS names; handlers return an exit code.
Only the chosen sub-command's module is imported (the others appear in `--help` from the
table's help lines), so the command line starts without importing numpy, pandas or scipy."""
from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> (help line, module with register(subparsers)); `--help` lists them in this
# order. tests/test_cli_startup.py checks each module registers exactly this name and help.
COMMANDS = {
    "run": ("run an experiment YAML and print its metrics table",
            "simserve.runner.cli"),
    "sweep": ("run every point of a sweep YAML (resumable)",
              "simserve.runner.sweep_cli"),
    "traces": ("list, fetch and summarise request traces",
               "simserve.workload.cli"),
    "profiles": ("hardware profiles: list, show, check, plot, controls",
                 "simserve.profiles_cli"),
    "policies": ("serving policies: list, show NAME (every option)",
                 "simserve.policies_cli"),
    "calibrate": ("measure kernels on this machine and fit profiles",
                  "simserve.calibrate.cli"),
    "capacity": ("highest sustainable request rate per policy for latency/SLO targets",
                 "simserve.runner.capacity_cli"),
    "explain": ("decompose a design's goodput lead over a baseline into its mechanisms",
                "simserve.explain.cli"),
    "plot": ("plot latency / SLO attainment vs rate and token timelines",
             "simserve.runner.plot_cli"),
    "regress": ("compare small experiments with stored baselines",
                "simserve.runner.regress_cli"),
    "validate": ("real executor vs cost model (iterations, replay)",
                 "simserve.realcheck.cli"),
    "check-policy": ("run a policy leap vs step (and compiled vs source) on a small "
                     "workload; check its tokens", "simserve.policy_check"),
    "cache": ("the disk cache of parsed profiles and traces: info, clear",
              "simserve.cache_cli"),
    "plan": ("the cheapest deployment (GPUs, design, knobs, router) that meets an SLO",
             "simserve.plan.cli"),
}
COMMAND_MODULES = tuple(dict.fromkeys(mod for _, mod in COMMANDS.values()))


class _VersionAction(argparse.Action):
    """`--version`, resolving simserve.__version__ only when asked (it reads package metadata)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the version and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import simserve
        from simserve.compiled import summary
        print(f"simserve {simserve.__version__} ({summary()})")
        parser.exit()


def _chosen(argv: list[str]) -> str | None:
    """The sub-command named on the command line (the top level has only flags)."""
    for a in argv:
        if not a.startswith("-"):
            return a
    return None


def build_parser(argv: list[str] | None = None, *, full: bool = False) -> argparse.ArgumentParser:
    """The parser for `argv`: the chosen sub-command fully registered (its module imported),
    the others as help-only stubs. `full=True` registers every sub-command (imports all)."""
    chosen = _chosen(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="simserve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (help_line, mod) in COMMANDS.items():
        if full or name == chosen:
            importlib.import_module(mod).register(sub)
        else:
            sub.add_parser(name, help=help_line)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    from simserve.errors import SimserveError
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
