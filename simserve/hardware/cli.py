"""`simserve profiles list | show NAME`."""
from __future__ import annotations

import argparse

from simserve.hardware.profile import available_profiles, load_profile


def _list(args: argparse.Namespace) -> int:
    rows = [("name", "kind", "provenance", "models", "device")]
    for name, path in available_profiles().items():
        p = load_profile(path)
        rows.append((name, p.kind, p.provenance_type, str(len(p.models())),
                     str(p.spec.get("vendor_name", ""))))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(x.ljust(n) for x, n in zip(r, w)).rstrip())
    return 0


def _show(args: argparse.Namespace) -> int:
    p = load_profile(args.name)
    print(f"{p.name} ({p.kind}, {p.provenance_type}) from {p.path}")
    for k, v in p.provenance.items():
        print(f"  provenance.{k}: {v}")
    for k, v in p.spec.items():
        print(f"  spec.{k}: {v}")
    for k, v in (p.overheads or p.link).items():
        print(f"  {'overheads' if p.overheads else 'link'}.{k}: {v}")
    if p.models():
        print(f"  op tables for: {', '.join(p.models())}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from simserve.calibrate.check import run_check
    text, ok = run_check(args.name)
    print(text)
    return 0 if ok or not args.strict else 1


def register(sub) -> None:
    p = sub.add_parser("profiles", help="hardware profiles: list, show")
    s = p.add_subparsers(dest="profiles_cmd", metavar="ACTION")
    s.required = True
    a = s.add_parser("list", help="shipped profiles and their provenance")
    a.set_defaults(handler=_list)
    b = s.add_parser("show", help="one profile's provenance, datasheet numbers and overheads")
    b.add_argument("name")
    b.set_defaults(handler=_show)
    c = s.add_parser("check", help="held-out error of a measured profile's fits, per op")
    c.add_argument("name")
    c.add_argument("--strict", action="store_true", help="exit 1 when an op misses its bar")
    c.set_defaults(handler=_check)
