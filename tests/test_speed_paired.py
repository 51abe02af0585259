"""benchmarks/speed_paired.py: the parts that decide whether a paired run is fair, without building."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "speed_paired.py"


@pytest.fixture(scope="module")
def sp():
    spec = importlib.util.spec_from_file_location("speed_paired", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["speed_paired"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_children_inherit_no_source_switch_or_checkout_path(sp, monkeypatch):
    monkeypatch.setenv("SIMSERVE_PURE_PYTHON", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("SIMSERVE_COMPILE", "1")
    env = sp.clean_env()
    assert "SIMSERVE_PURE_PYTHON" not in env and "SIMSERVE_COMPILE" not in env
    assert "PYTHONPATH" not in env
    assert env["SIMSERVE_TRACE_DIR"] == str(sp.TRACES)


def records(times):
    return SimpleNamespace(token_times_s=np.array(times, dtype=np.float64),
                           num_preemptions=np.array([0, 1], dtype=np.int64),
                           first_token_s=np.array([0.5, 0.7]), finish_s=np.array([1.0, 2.0]))


def test_digest_sees_one_token_time_and_the_iteration_counts(sp):
    base = sp.record_digest(records([0.5, 1.0, 0.7, 2.0]), 10, 3)
    assert base == sp.record_digest(records([0.5, 1.0, 0.7, 2.0]), 10, 3)
    assert base != sp.record_digest(records([0.5, 1.0, 0.7, 2.0 + 1e-12]), 10, 3)
    assert base != sp.record_digest(records([0.5, 1.0, 0.7, 2.0]), 10, 4)
    # the same values held in another dtype hash alike (the two builds may store them differently)
    r = records([0.5, 1.0, 0.7, 2.0])
    r.num_preemptions = r.num_preemptions.astype(np.int32)
    assert base == sp.record_digest(r, 10, 3)


def test_an_unknown_revision_stops_before_building(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "no-such-rev-xyz", "HEAD",
                          str(tmp_path / "o.txt"), "--work", str(tmp_path / "w")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no-such-rev-xyz" in out.stderr
    assert not (tmp_path / "w" / "src").exists() and not list((tmp_path / "w").glob("*/src"))


def test_a_malformed_b_params_is_a_one_line_error(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "HEAD", "HEAD", str(tmp_path / "o.txt"),
                          "--b-params", "neo-fig9a={predictor: oracle}",
                          "--work", str(tmp_path / "w")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--b-params" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "w").exists()
