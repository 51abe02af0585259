"""`simserve regress DIR [--update] [--verbose] [--junit-xml FILE]`."""
from __future__ import annotations

import argparse
from pathlib import Path

from simserve.errors import SimserveError


def _regress(args: argparse.Namespace) -> int:
    from simserve.runner.regress import regress
    folder = Path(args.dir)
    if not folder.is_dir():
        raise SimserveError(f"{folder}: no such folder")
    junit = Path(args.junit_xml) if args.junit_xml else None
    if junit is not None and not junit.resolve().parent.is_dir():
        raise SimserveError(f"--junit-xml {junit}: no such folder {junit.parent}")
    report, ok = regress(folder, update=args.update, verbose=args.verbose, junit=junit)
    print(report)
    if not ok:
        print("regression check FAILED: outputs moved beyond tolerance (see CHANGED rows); "
              "if the change is intended, rerun with --update")
    return 0 if ok else 1


def register(sub) -> None:
    p = sub.add_parser("regress", help="compare small experiments with stored baselines")
    p.add_argument("dir", help="folder of experiment YAMLs, with baselines/ beside them "
                               "(--update records them) and optionally regress.yaml")
    p.add_argument("--update", action="store_true", help="rewrite the baselines")
    p.add_argument("-v", "--verbose", action="store_true", help="print every comparison")
    p.add_argument("--junit-xml", metavar="FILE",
                   help="also write the comparisons as a JUnit XML report (a test case per "
                        "metric of each experiment's policy curve), for CI systems")
    p.set_defaults(handler=_regress)
