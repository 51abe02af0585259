"""Start-up: the command line imports only the chosen sub-command's module, `import simserve`
imports nothing heavy, and the lazy table of sub-commands matches what each module registers."""
from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import simserve
from simserve import cli

ROOT = Path(__file__).resolve().parent.parent


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; "
                          "print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_command_table_matches_register(name):
    """Each module in the table registers exactly its sub-command, with the table's help line
    (what `--help` prints without importing it)."""
    help_line, mod = cli.COMMANDS[name]
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    importlib.import_module(mod).register(sub)
    assert [(a.dest, a.help) for a in sub._choices_actions] == [(name, help_line)]


def test_help_lists_every_command_without_importing_them(capsys):
    mods = _modules_after("from simserve.cli import build_parser\n"
                          "build_parser(['--help'])")
    assert not {"numpy", "pandas", "scipy", "yaml", "simpy"} & mods
    # (simserve.compiled: the SIMSERVE_PURE_PYTHON hook and stale-module guard that
    # `import simserve` installs, standard library only)
    assert not any(m.startswith("simserve.") and m not in ("simserve.cli", "simserve.compiled")
                   for m in mods)
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for name, (help_line, _) in cli.COMMANDS.items():
        assert name in text and help_line.split()[0] in text


def test_chosen_command_parses_fully():
    args = cli.build_parser(["run", "x.yaml", "--no-save"]).parse_args(["run", "x.yaml",
                                                                          "--no-save"])
    assert args.file == "x.yaml" and args.no_save and callable(args.handler)
    full = cli.build_parser([], full=True)
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(cli.COMMANDS)


def test_import_simserve_is_light():
    mods = _modules_after("import simserve")
    assert not {"numpy", "pandas", "scipy", "yaml", "simpy", "importlib.metadata"} & mods


def test_run_path_does_not_import_scipy_stats():
    mods = _modules_after("import simserve.runner.cli")
    assert "scipy.stats" not in mods and "matplotlib" not in mods


def test_version_and_dir(capsys):
    v = simserve.__version__
    text = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{v}"' in text
    assert simserve._read_version() == v
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and re.fullmatch(
        rf"simserve {re.escape(v)} \((pure Python; )?compiled modules: \d+/\d+"
        rf"( \(others [a-z, ]+\))?(; not compiled at install: .+)?\)",
        capsys.readouterr().out.strip())
    names = dir(simserve)
    for name in simserve.__all__:
        assert name in names
        assert getattr(simserve, name) is not None
    assert callable(simserve.simulate) and simserve.simulate.__module__ == "simserve.api"
    with pytest.raises(AttributeError):
        simserve.no_such_name


def test_python_dash_m_simserve():
    out = subprocess.run([sys.executable, "-m", "simserve", "--version"], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.startswith("simserve ")
