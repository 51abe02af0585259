"""Fitting raw calibration points into profiles, the held-out check, and rescaling, on
synthetic raw folders whose true functions are known (no PyTorch needed)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from simserve.calibrate.build import build_gpu, build_link
from simserve.calibrate.check import check_errors, summary
from simserve.calibrate.tables import fit_curve, holdout_errors_1d, holdout_errors_grid
from simserve.cost import GpuCostModel, prefill_batch
from simserve.policies.dualpace.controls import (cpu_batch_limit_from, gpu_token_limit_from,
                                                 route_scores, route_times_from, assist_thresholds,
                                                 stage_wait_us, CPU_BATCHES)
from simserve.hardware.derive import write_profile
from simserve.hardware.profile import load_profile
from simserve.hardware.rescale import rescale_ops
from simserve.models import get_model

TOK = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def _write_raw(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "gpu_dense.csv", index=False)
    (folder / "meta.json").write_text(json.dumps({"env": {"gpu": {"name": "Test GPU"},
                                                          "command": "synthetic"}}))


def _dense_rows(model="llama-3.1-8b", tp=1):
    rows = []
    for op, slope in (("qkv", 0.01), ("o", 0.007), ("gate_up", 0.05), ("down", 0.025),
                      ("lm_head", 0.2)):
        for t in TOK:
            rows.append(dict(part="gpu_dense", model=model, tp=tp, op=op, tokens=t,
                             median_us=10.0 + slope * t, timer="cuda_events"))
    for op in ("rmsnorm_add", "rope", "kv_write", "silu_mul"):
        for t in TOK:
            rows.append(dict(part="gpu_elementwise", model=model, tp=tp, op=op, tokens=t,
                             median_us=3.0 + 0.001 * t, timer="cuda_events"))
    return rows


def _attn_rows(model="llama-3.1-8b", tp=1):
    rows = []
    for c in (16, 64, 256, 1024, 4096):
        for x in (0, 256, 1024, 4096, 16384):
            rows.append(dict(part="gpu_prefill_attn", model=model, tp=tp, op="prefill_attn",
                             chunk=c, context=x, median_us=5.0 + 1e-4 * c * (x + c / 2)))
    for b in (1, 4, 16, 64, 256):
        for x in (64, 256, 1024, 4096, 16384):
            rows.append(dict(part="gpu_decode_attn", model=model, tp=tp, op="decode_attn",
                             batch=b, context=x, median_us=6.0 + 1e-3 * b * x))
    return rows


def test_affine_functions_are_fitted_exactly_and_held_out_points_predicted():
    x = np.array(TOK, float)
    y = 10.0 + 0.05 * x
    c = fit_curve("t", x, y)
    assert np.allclose(c(x), y)
    xs, meas, pred = holdout_errors_1d(x, y)
    assert len(xs) == 3 and np.allclose(meas, pred)  # linear between knots is exact


def test_non_monotone_points_become_a_monotone_table():
    c = fit_curve("t", [1, 2, 3, 4], [10.0, 30.0, 20.0, 40.0])
    assert np.all(np.diff(c.y) >= 0)
    assert c(2) == pytest.approx(25.0) and c(3) == pytest.approx(25.0)  # PAVA pools 30, 20


def test_grid_holdout_on_a_smooth_surface_is_accurate():
    b, x = np.meshgrid([1, 2, 4, 8, 16, 32, 64], [64, 128, 256, 512, 1024, 2048, 4096])
    t = 6.0 + 1e-3 * b * x
    _, meas, pred = holdout_errors_grid(b.ravel(), x.ravel(), t.ravel())
    assert len(meas) > 5
    assert np.max(np.abs(pred - meas) / meas) < 0.06


def test_build_gpu_profile_from_raw_and_simulate_on_it(tmp_path):
    raw = tmp_path / "raw" / "test"
    _write_raw(raw, _dense_rows() + _attn_rows())
    prof = build_gpu(raw, "h200-sxm")
    t = prof["ops"]["llama-3.1-8b"]["tp1"]
    assert t["source"] == "measured"
    assert t["qkv_us"][TOK.index(512)] == pytest.approx(10.0 + 0.01 * 512)
    assert t["elementwise_us"][0] == pytest.approx(5 * (3.0 + 0.001))  # 2 norms + 3 kernels
    assert prof["ops"]["llama-3.1-70b"]["tp1"]["source"].startswith("derived")
    # TP2 of the same model was not measured: derived, not invented
    assert prof["ops"]["llama-3.1-8b"]["tp2"]["source"].startswith("derived")
    # the serving engine's host path (measured from real vLLM, not by kernel calibration)
    # survives a refit of the kernel tables
    assert prof["overheads"]["engines"] == load_profile("h200-sxm").overheads["engines"]
    path = write_profile(prof, tmp_path / "test-gpu.yaml")
    p = load_profile(path)
    assert p.provenance_type == "measured"
    cost = GpuCostModel(get_model("llama-3.1-8b"), p, 1, None)
    per_layer = cost.step_s(prefill_batch(1024)) * 1e6
    assert per_layer > 32 * (10.0 + 0.05 * 1024)  # at least the gate_up GEMMs


def test_check_reports_zero_error_on_linear_data(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    _write_raw(raw, _dense_rows())
    prof = build_gpu(raw, "h200-sxm")
    p = load_profile(write_profile(prof, tmp_path / "x.yaml"))
    s = summary(p, check_errors(p)).set_index("op")
    assert s.loc["gate_up", "mape_pct"] == pytest.approx(0.0, abs=1e-9)
    assert bool(s.ok.all())


def test_link_latency_and_bandwidth_are_recovered(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    sizes = [2 ** k for k in range(12, 31)]
    rows = [dict(part="links", op=f"{d}_pinned", bytes=n, timer="cuda_events",
                 median_us=4.0 + n / (50e9 / 1e6)) for d in ("h2d", "d2h") for n in sizes]
    pd.DataFrame(rows).to_csv(raw / "links.csv", index=False)
    prof = build_link(raw, "pcie5-x16")
    assert prof["link"]["h2d_gbps"] == pytest.approx(50.0, rel=1e-3)
    assert prof["link"]["h2d_latency_us"] == pytest.approx(4.0, rel=1e-2)


def test_rescaling_scales_compute_bound_points_by_flops_and_small_ones_by_bandwidth():
    t = {"tokens": [1, 16384], "qkv_us": [20.0, 1000.0], "o_us": [20.0, 400.0],
         "gate_up_us": [60.0, 5000.0], "down_us": [30.0, 2500.0], "lm_head_us": [250.0, 2e4],
         "elementwise_us": [10.0, 300.0],
         "prefill_attn": {"work": [1, 2], "us": [1, 2]}, "decode_attn": {"const_us": 1}}
    src, dst = (1000e12, 5e12), (250e12, 1e12)  # 4x less compute, 5x less bandwidth
    out = rescale_ops(t, "llama-3.1-8b", 1, src, dst)
    floor = 4.0  # min(0.8 x 20, 4)
    assert out["qkv_us"][1] == pytest.approx(floor + (1000.0 - floor) * 4, rel=1e-4)
    assert out["qkv_us"][0] == pytest.approx(floor + (20.0 - floor) * 5, rel=1e-4)


def test_dualpace_controls_on_the_rtx4090_profiles():
    # DualPace §4.3 / Fig. 7 on RTX 4090 + 12 cores of a Xeon Silver 4510 with Llama-3.1-8B:
    # GPU batched-token limit 1024, CPU decode batch limit 256, exact (P, F) optimum (32, 0)
    m = get_model("llama-3.1-8b")
    gpu, cpu = load_profile("rtx4090"), load_profile("xeon-silver-4510")
    limit = gpu_token_limit_from(gpu, m, 1)
    assert limit == 1024
    cops = cpu.cpu_ops(m.name, 12)
    assert cpu_batch_limit_from(cops) == 256
    B = np.array(CPU_BATCHES)
    rt = route_times_from(gpu.ops(m.name, 1), cops, load_profile("pcie4-x16"), m, B,
                          wait_us=stage_wait_us(gpu, m, 1, limit))
    assert assist_thresholds(B, route_scores(rt, m.num_layers), m.num_layers, 0.0) == (32, 0)
