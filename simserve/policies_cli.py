"""`simserve policies [list | show NAME] [--markdown]`: the registered serving policies and
every option of each, documented from its config dataclass (simserve/policy_reference.py)."""
from __future__ import annotations

import argparse
import textwrap

WIDTH = 100  # fixed, so the output does not depend on the terminal


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent)


def _list(args: argparse.Namespace) -> int:
    if args.markdown:
        from simserve.policy_reference import markdown
        print(markdown(), end="")
        return 0
    from simserve.policies import policy_names
    from simserve.policy_reference import policy_summary  # no policy module imported
    names = policy_names()
    w = max(map(len, names)) + 2
    for name in names:
        summary, source = policy_summary(name)
        summary = summary or "(its module has no docstring)"
        print(_wrap(summary, " " * w).replace(" " * w, name.ljust(w), 1))
        print(_wrap(f"source: {source}", " " * w))
    print("\n`simserve policies show NAME` lists a policy's options.")
    return 0


def _show(args: argparse.Namespace) -> int:
    from simserve.policy_reference import HOST_PATH, policy_doc
    d = policy_doc(args.name)  # an unknown name is a ConfigError with "did you mean"
    print(_wrap(f"{d.name}: {d.summary}", ""))
    print(_wrap(f"source: {d.source}", ""))
    if d.name in HOST_PATH:
        print(_wrap(f"engine and host path: {HOST_PATH[d.name]}", ""))
    print(_wrap(f"config: {d.config}; set options in an experiment's `policies:` list, "
                f"e.g. `- {{name: {d.name}, {d.options[0].name}: ...}}`", ""))
    for o in d.options:
        print(f"\n{o.name}  ({o.type}, default {o.default})")
        print(_wrap(o.doc or "(undocumented)", "    "))
    return 0


def register(sub) -> None:
    p = sub.add_parser("policies", help="serving policies: list, show NAME (every option)")
    p.add_argument("--markdown", action="store_true",
                   help="print the reference of the built-in policies as Markdown "
                   "(docs/policies.md)")
    p.set_defaults(handler=_list)
    s = p.add_subparsers(dest="policies_cmd", metavar="ACTION")
    a = s.add_parser("list", help="each policy in one line, with its paper or source")
    a.add_argument("--markdown", action="store_true", help=argparse.SUPPRESS)
    a.set_defaults(handler=_list)
    b = s.add_parser("show", help="every option of one policy: type, default, meaning")
    b.add_argument("name")
    b.set_defaults(handler=_show)
