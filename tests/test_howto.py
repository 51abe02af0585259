"""The how-to pages' commands work: every `bash` block of docs/how-to/add-a-hardware-profile.md
and add-a-metric.md runs, in order, in a temporary folder (HOME and the XDG folders inside it,
`simserve` and `python` on PATH as this interpreter, the repository's `hwprofiles/` beside it),
and leaves the files it promises; `sh` blocks need a GPU or PyTorch, so their `simserve`
commands are only parsed and their `python -m` / `torchrun -m` modules looked up."""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from simserve import cli

ROOT = Path(__file__).resolve().parent.parent
HOWTO = ROOT / "docs" / "how-to"
# page -> files its bash blocks must leave behind (relative to the folder they ran in)
PAGES = {
    "add-a-hardware-profile.md": ["my-profiles/rescaled/h20.yaml",
                                  "my-profiles/roofline/h20.yaml",
                                  "my-profiles/refit/h200-sxm.yaml",
                                  "my-profiles/refit/xeon-emr.yaml",
                                  "my-profiles/refit/pcie5-x16.yaml"],
    "add-a-metric.md": ["results/metric-demo/summary.json", "results/metric-demo/requests.csv",
                        "results/metric-demo/plots/latency.png"],
}
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.M | re.S)


def blocks(page: str, lang: str) -> list[str]:
    text = (HOWTO / page).read_text(encoding="utf-8")
    return [body for kind, body in FENCE.findall(text) if kind == lang]


def commands(block: str) -> list[list[str]]:
    """The block's commands as argument lists (continuation lines joined, comments dropped)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]  # VAR=value prefixes
        if words:
            out.append(words)
    return out


def _shims(bin_dir: Path) -> None:
    bin_dir.mkdir()
    for name, args in (("simserve", "-m simserve"), ("python", ""), ("python3", "")):
        p = bin_dir / name
        p.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        p.chmod(0o755)


@pytest.mark.parametrize("page", list(PAGES))
def test_bash_blocks_run(page, tmp_path):
    script = blocks(page, "bash")
    assert script, f"{page}: no bash block"
    _shims(tmp_path / "bin")
    (tmp_path / "hwprofiles").symlink_to(ROOT / "hwprofiles")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMSERVE_")}
    env.update(PATH=f"{tmp_path / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=str(ROOT), HOME=str(tmp_path),
               XDG_CONFIG_HOME=str(tmp_path / ".config"), XDG_CACHE_HOME=str(tmp_path / ".cache"),
               MPLBACKEND="Agg")
    r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + "\n".join(script)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{page}: a command failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    for f in PAGES[page]:
        assert (tmp_path / f).is_file(), f"{page}: expected {f}"
    assert not (tmp_path / ".config" / "simserve").exists(), "wrote into the user's config"


@pytest.mark.parametrize("page", list(PAGES))
def test_sh_blocks_name_real_commands(page):
    for block in blocks(page, "sh"):
        for argv in commands(block):
            if argv[0] == "simserve":
                args = cli.build_parser(argv[1:]).parse_args(argv[1:])
                assert callable(args.handler), argv
            elif argv[0] in ("python", "python3", "torchrun"):
                mod = argv[argv.index("-m") + 1]
                assert importlib.util.find_spec(mod) is not None, argv
            else:
                pytest.fail(f"{page}: unexpected command {argv[0]!r}")


def test_the_pages_have_checked_blocks():
    assert blocks("add-a-hardware-profile.md", "sh")  # the GPU commands are at least parsed
    for page in PAGES:
        for kind, _ in FENCE.findall((HOWTO / page).read_text(encoding="utf-8")):
            assert kind in ("bash", "sh", "python"), f"{page}: unchecked ```{kind} block"
