"""`simserve regress`: stored curves catch a planted slowdown and accept the unchanged tree."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from simserve.cli import main

REPO = Path(__file__).resolve().parents[1]
CI = REPO / "experiments" / "ci"
EXP = "vllm-h100-conversation"


@pytest.fixture()
def ci_copy(tmp_path):
    d = tmp_path / "ci"
    d.mkdir()
    shutil.copy(CI / f"{EXP}.yaml", d)
    shutil.copy(CI / "regress.yaml", d)
    (d / "baselines").mkdir()
    shutil.copy(CI / "baselines" / f"{EXP}.json", d / "baselines")
    return d


def _slow_profile(tmp_path, factor: float) -> Path:
    """A copy of the h100-sxm profile with every dense op of Llama-3.1-8B slower by factor."""
    prof = yaml.safe_load((REPO / "simserve" / "data" / "hwprofiles" / "h100-sxm.yaml").read_text())
    for t in prof["ops"]["llama-3.1-8b"].values():
        for op in ("qkv", "o", "gate_up", "down", "elementwise"):
            t[f"{op}_us"] = [v * factor for v in t[f"{op}_us"]]
    out = tmp_path / "profiles"
    out.mkdir()
    (out / "h100-sxm.yaml").write_text(yaml.safe_dump(prof))
    return out


def test_unchanged_tree_passes(ci_copy, capsys):
    assert main(["regress", str(ci_copy)]) == 0
    assert "0 changed" in capsys.readouterr().out


def test_planted_ten_percent_slowdown_fails(ci_copy, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SIMSERVE_PROFILE_DIR", str(_slow_profile(tmp_path, 1.10)))
    assert main(["regress", str(ci_copy)]) == 1
    out = capsys.readouterr().out
    assert "CHANGED" in out and "mean_tpot_ms" in out and "FAILED" in out


def test_change_within_tolerance_passes(ci_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("SIMSERVE_PROFILE_DIR", str(_slow_profile(tmp_path, 1.002)))
    assert main(["regress", str(ci_copy)]) == 0


def test_update_rewrites_baselines_and_missing_baseline_fails(ci_copy, tmp_path, monkeypatch):
    (ci_copy / "baselines" / f"{EXP}.json").unlink()
    assert main(["regress", str(ci_copy)]) == 1
    assert main(["regress", str(ci_copy), "--update"]) == 0
    assert (ci_copy / "baselines" / f"{EXP}.json").exists()
    assert main(["regress", str(ci_copy)]) == 0
