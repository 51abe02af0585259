"""Derived CPU profiles are anchored to published measurements (hardware/anchors.py), and
derived GPUs carry Conflux Parallelism contention rescaled from the H200's measurement."""
from __future__ import annotations

import copy

import pytest
import yaml

from simserve.hardware import anchors as A
from simserve.hardware import datasheets as ds
from simserve.hardware.profile import load_profile
from simserve.hardware.rescale import rescale_cpu, rescale_sp_contention
from simserve.profiles_cli import anchor_report


def _write(tmp_path, d: dict):
    path = tmp_path / f"{d['name']}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return load_profile(path)


def _yaml(name: str) -> dict:
    return yaml.safe_load(load_profile(name).path.read_text())


@pytest.mark.parametrize("name", ["xeon-silver-4510", "xeon-8469c"])
def test_every_derived_cpu_names_a_fitted_anchor_it_meets(name):
    p = load_profile(name)
    rows = A.residuals(p)
    assert rows and all(r["source"] and r["date"] for r in rows)
    fitted = [r for r in rows if r["fit"]]
    assert fitted and all(abs(r["residual"]) < 0.01 for r in fitted)
    assert anchor_report(p)[1]


def test_a_derived_cpu_without_an_anchor_fails_the_check(tmp_path):
    d = _yaml("xeon-silver-4510")
    del d["provenance"]["anchors"]
    text, ok = anchor_report(_write(tmp_path, d))
    assert not ok and "provenance.anchors" in text
    from simserve.cli import main
    assert main(["profiles", "check", str(tmp_path / "xeon-silver-4510.yaml")]) == 1


def test_the_residual_is_computed_from_the_profile(tmp_path):
    """Halving the dense tables' speed moves the layer-throughput prediction; the anchor's
    value does not move."""
    d = _yaml("xeon-silver-4510")
    base = {r["id"]: r for r in A.residuals(_write(tmp_path, d))}
    slow = copy.deepcopy(d)
    t = slow["ops"]["llama-3.1-8b"]["cores12"]
    for op in ("qkv", "o", "gate_up", "down"):
        t[f"{op}_us"] = [2 * v for v in t[f"{op}_us"]]
    (tmp_path / "slow").mkdir()
    moved = {r["id"]: r for r in A.residuals(_write(tmp_path / "slow", slow))}
    assert moved["dualpace-fig7b"]["value"] == base["dualpace-fig7b"]["value"]
    assert moved["dualpace-fig7b"]["predicted"] < 0.7 * base["dualpace-fig7b"]["predicted"]
    assert moved["dualpace-fig3"]["predicted"] > 1.5 * base["dualpace-fig3"]["predicted"]


def test_without_its_anchor_the_4510_falls_back_to_the_efficiency_ceiling(monkeypatch):
    anchored = rescale_cpu("xeon-emr", "xeon-silver-4510", 12, 12)
    monkeypatch.setitem(A.ANCHORS, "xeon-silver-4510", [])
    plain = rescale_cpu("xeon-emr", "xeon-silver-4510", 12, 12)
    a = anchored["ops"]["llama-3.1-8b"]["cores12"]["gate_up_us"][-1]
    b = plain["ops"]["llama-3.1-8b"]["cores12"]["gate_up_us"][-1]
    assert a < 0.8 * b          # the anchor (Fig. 7b) asks for a faster compute-bound regime
    assert "dualpace-fig7b" in anchored["provenance"]["method"]
    assert f"{ds.CPU_EFFICIENCY['amx']}" in plain["provenance"]["method"]


def test_an_unknown_anchor_quantity_is_named():
    with pytest.raises(ValueError, match="unknown quantity"):
        A.predict(load_profile("xeon-silver-4510"), {"id": "x", "quantity": "speed"})


H200 = ds.GPUS["h200-sxm"]


def test_contention_rescales_by_bandwidth_per_sm():
    c = {"alpha": 1.0, "beta": 1.72, "beta_range": [1.7, 1.98], "source": "m"}
    same = rescale_sp_contention(c, "h200-sxm", H200, H200)
    assert same["beta"] == pytest.approx(1.72, abs=1e-3) and same["alpha"] == 1.0
    h100 = rescale_sp_contention(c, "h200-sxm", H200, ds.GPUS["h100-sxm"])
    ada = rescale_sp_contention(c, "h200-sxm", H200, ds.GPUS["rtx4090"])
    h20 = rescale_sp_contention(c, "h200-sxm", H200, ds.GPUS["h20"])
    assert 1.0 < ada["beta"] < h100["beta"] < 1.72 < h20["beta"]
    assert h100["beta_range"][0] <= h100["beta"] <= h100["beta_range"][1]


@pytest.mark.parametrize("name", ["h200-sxm", "h100-sxm", "h20", "rtx4090"])
def test_every_gpu_profile_carries_contention_not_the_paper_s(name):
    c = load_profile(name, "gpu").overheads["sp_contention"]
    assert (c["alpha"], c["beta"]) != (1.28, 1.28) and c["beta"] != 1.28
    assert c["beta_range"][0] <= c["beta"] <= c["beta_range"][1]


def test_the_sp_cost_model_defaults_to_the_profile_s_contention():
    from simserve.cost.sp import SpCostModel
    from simserve.models import get_model
    from tests.sp_hand import HW4
    cost = SpCostModel(get_model("qwen3-14b"), HW4.gpu, HW4.nvlink, 4)
    c = HW4.gpu.overheads["sp_contention"]
    assert (cost.alpha, cost.beta) == (c["alpha"], c["beta"])
