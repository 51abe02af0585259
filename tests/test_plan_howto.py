"""docs/how-to/plan-a-deployment.md: its bash blocks run, in order, in a temporary folder
(`simserve` and `python` on PATH as this interpreter) and leave what the page promises."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "how-to" / "plan-a-deployment.md"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.mark.timeout(900)
def test_plan_howto_bash_blocks_run(tmp_path):
    script = [body for kind, body in FENCE.findall(PAGE.read_text()) if kind == "bash"]
    assert len(script) >= 2
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, args in (("simserve", "-m simserve"), ("python", "")):
        p = bin_dir / name
        p.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        p.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMSERVE_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT),
               HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / ".cache"), MPLBACKEND="Agg")
    r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + "\n".join(script)], check=False,
                       cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    for f in ("plan.csv", "plan.json", "pareto.png", "winner.yaml", "plan-state.jsonl"):
        assert (tmp_path / "results" / "chat-plan" / f).is_file(), f
    assert (tmp_path / "results" / "chat-winner" / "summary.json").is_file()
    assert "winner:" in r.stdout


def test_plan_howto_python_block_names_real_api():
    import simserve.plan as sp
    text = PAGE.read_text()
    for name in re.findall(r"res\.(\w+)\(", text):
        assert hasattr(sp.PlanResult, name), name
