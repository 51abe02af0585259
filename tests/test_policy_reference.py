"""The policy reference: docs/policies.md is what `simserve policies --markdown` prints, every
option of every policy has a description read from its config source, the comment-reading rule
assigns each comment to the right field, and `simserve policies` answers bad names in one line."""
from __future__ import annotations

import dataclasses
import json
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simserve import cli
from simserve.policies import builtin_policies, get_policy, policy_names
from simserve.policy_reference import (HOST_PATH, SUMMARIES, all_policy_docs, config_options,
                                       markdown)

ROOT = Path(__file__).resolve().parent.parent


def test_committed_reference_is_the_generated_one():
    committed = (ROOT / "docs" / "policies.md").read_text(encoding="utf-8")
    assert committed == markdown(), ("docs/policies.md is stale: run "
                                     "`simserve policies --markdown > docs/policies.md`")


def test_every_option_of_every_policy_is_documented():
    undocumented = [f"{d.name}.{o.name}" for d in all_policy_docs(builtin_only=True)
                    for o in d.options
                    if len(o.doc.split()) < 3]
    assert not undocumented, f"options without a description in their config source: {undocumented}"


def test_every_builtin_policy_has_a_summary_and_every_field_is_listed():
    assert set(SUMMARIES) == set(builtin_policies())
    assert set(HOST_PATH) == set(builtin_policies())  # every design says which engine it ran on
    for d in all_policy_docs(builtin_only=True):
        cls, _ = get_policy(d.name)
        assert [o.name for o in d.options] == [f.name for f in dataclasses.fields(cls)]
        assert d.summary and d.source


def _load(tmp_path, source: str):
    path = tmp_path / "cfgmod.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location("cfgmod_for_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve the module by name while building
    spec.loader.exec_module(mod)
    return mod


def test_comments_are_assigned_to_their_field(tmp_path):
    mod = _load(tmp_path, '''
        from __future__ import annotations
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class Base:
            # -- a section header, not documentation -----
            # lead of a, first line
            # lead of a, second line
            a: int = 1  # trailing of a
                        # continuation of a's trailing comment
            b: str | None = None

            # lead of c (a blank line above ends b's nothing)
            c: bool = True

        @dataclass(frozen=True)
        class Child(Base):
            b: str | None = "x"   # child's own b
            c: bool = False
    ''')
    try:
        opts = {o.name: o for o in config_options(mod.Child)}
    finally:
        del sys.modules["cfgmod_for_test"]
    assert opts["a"].doc == ("lead of a, first line lead of a, second line; trailing of a "
                             "continuation of a's trailing comment")
    assert opts["b"].doc == "child's own b" and opts["b"].default == "x"
    assert opts["b"].type == "str | None"
    # a redeclared field without a comment keeps its base class's documentation
    assert opts["c"].doc.startswith("lead of c") and opts["c"].default == "false"


def _simserve(*args):
    return subprocess.run([sys.executable, "-m", "simserve", *args], capture_output=True,
                          text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"})


def test_show_lists_every_option_with_type_default_and_doc(capsys):
    assert cli.main(["policies", "show", "conflux"]) == 0
    out = capsys.readouterr().out
    cls, _ = get_policy("conflux")
    for f in dataclasses.fields(cls):
        assert f"\n{f.name}  (" in out
    assert "tbt_ms  (float, default 100.0)" in out
    assert "(undocumented)" not in out


def test_list_names_every_policy(capsys):
    assert cli.main(["policies"]) == 0
    out = capsys.readouterr().out
    for name in policy_names():
        assert any(line.startswith(name + " ") for line in out.splitlines())


def test_unknown_policy_is_one_line_with_a_suggestion():
    r = _simserve("policies", "show", "vlm")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "did you mean 'vllm'" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("argv", [["policies", "--markdown"], ["policies", "list", "--markdown"]])
def test_markdown_command_prints_the_reference(capsys, argv):
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == markdown()


def test_listing_imports_no_policy_module():
    """`simserve policies` answers from the names and summaries alone (fast, like --help)."""
    code = ("import sys, json\nfrom simserve import cli\ncli.main(['policies'])\n"
            "print(json.dumps(sorted(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"}, check=True)
    mods = set(json.loads(r.stdout.strip().splitlines()[-1]))
    loaded = {m for m in mods if m.startswith("simserve.policies.")}
    assert not loaded and not {"numpy", "scipy"} & mods, loaded


def test_a_policy_registered_at_run_time_is_listed_but_not_in_the_reference(capsys):
    """The committed reference must not depend on what else is installed or registered."""
    from dataclasses import dataclass

    from simserve.policies import _REGISTRY, register

    @dataclass(frozen=True)
    class ToyConfig:
        budget: int = 8  # tokens per step of the toy

    def build(ctx, cfg):  # never run here
        raise AssertionError

    register("zz-toy-doc", ToyConfig)(build)
    try:
        assert "zz-toy-doc" in policy_names()
        assert "zz-toy-doc" not in markdown()
        assert cli.main(["policies"]) == 0
        assert "zz-toy-doc" in capsys.readouterr().out
        assert cli.main(["policies", "show", "zz-toy-doc"]) == 0
        assert "tokens per step of the toy" in capsys.readouterr().out
    finally:
        del _REGISTRY["zz-toy-doc"]
