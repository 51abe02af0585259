"""Spatial-sharing curves: the fit from green-context runs, the committed profile against its raw
runs, and the carry-over to a derived GPU."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simserve.calibrate import smshare_fit
from simserve.hardware import datasheets as ds
from simserve.hardware.profile import load_profile
from simserve.hardware.rescale import rescale_sm_share

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "hwprofiles" / "raw" / "h200-sxm" / "smshare"


def _rows(bw, cf, alpha, beta, total=132, sms=(16, 32, 64), noise=()):
    """Rows as `calibrate.smshare` writes them, from known curves (functions of the fraction)."""
    rows = []
    for i, s in enumerate(sms):
        f = s / total
        for b, c in ((96, 8192), (32, 4096)):
            rows.append(dict(kind="decode_alone", decode_sms=s, decode_batch=b, decode_ctx=c,
                             ratio=1.0 / bw(f)))
        for ch, c in ((8192, 0), (2048, 8192)):
            rows.append(dict(kind="prefill_alone", prefill_sms=s, prefill_chunk=ch,
                             prefill_ctx=c, ratio=1.0 / cf(f)))
        rows.append(dict(kind="corun_decode", decode_sms=s, ratio=alpha(f),
                         note="5/5 runs covered; 2 prefill and 9 decode passes"))
        rows.append(dict(kind="corun_prefill", decode_sms=s, ratio=beta(f)))
    d = pd.DataFrame(rows)
    d["model"], d["shard"], d["total"], d["run"] = "m", 4, total, "r"
    return d


def test_curves_recover_known_shares_and_slowdowns():
    d = _rows(lambda f: min(1.0, 2.2 * f), lambda f: 1.2 * f, lambda f: 1.1 + f, lambda f: 1.0 + f / 2)
    c = smshare_fit.curves(d)
    f = np.array([16, 32, 64]) / 132
    assert c["sm_fraction"] == pytest.approx([*f, 1.0], abs=1e-4)
    assert c["bw_fraction"] == pytest.approx([*np.minimum(1, 2.2 * f), 1.0], abs=1e-4)
    assert c["compute_fraction"] == pytest.approx([*(1.2 * f), 1.0], abs=1e-4)
    assert c["decode_contention"] == pytest.approx(1.1 + f, abs=1e-4)
    assert c["prefill_contention"] == pytest.approx(1.0 + f / 2, abs=1e-4)


def test_curves_are_monotone_and_capped_even_when_a_point_is_not():
    # a measured dip at 64 SMs (wave quantisation) and a point above the whole GPU
    bw = {16: 0.3, 32: 1.05, 64: 0.9}
    d = _rows(lambda f: bw[round(f * 132)], lambda f: f, lambda f: 1.1, lambda f: 1.1)
    c = smshare_fit.curves(d)
    assert c["bw_fraction"] == pytest.approx([0.3, 1.0, 1.0, 1.0])
    assert all(np.diff(c["compute_fraction"]) >= 0)


def test_committed_profile_is_the_fit_of_the_committed_runs():
    fit = smshare_fit.fit(RAW)
    stored = json.loads((RAW / "smshare.json").read_text())
    share = load_profile("h200-sxm").overheads["sm_share"]
    for k in ("sm_fraction", "bw_fraction", "compute_fraction", "corun_decode_fraction",
              "decode_contention", "prefill_contention"):
        assert fit[k] == stored[k] == share[k]
    m = fit["mape_pct"]
    held = m["measured curves, fitted on the other models"]
    # the measured curves predict partitions of a model they did not see better than the
    # analytic defaults (half-SM HBM saturation, compute proportional to SMs, 1.28 contention)
    for k, v in held.items():
        assert v < m["analytic defaults"][k]
    # co-running slowdowns measured on every model are below the 1.28 borrowed from Fig. 14a
    assert max(fit["decode_contention"] + fit["prefill_contention"]) < 1.28


def test_derived_gpu_with_the_same_sms_keeps_curves_with_bandwidth_rescaled():
    src = load_profile("h200-sxm").overheads["sm_share"]
    out = rescale_sm_share(src, "h200-sxm", ds.GPUS["h200-sxm"], ds.GPUS["h100-sxm"])
    k = 4800 / 3350
    assert out["bw_fraction"] == pytest.approx([min(1.0, v * k) for v in src["bw_fraction"]],
                                               abs=1e-4)
    assert out["compute_fraction"] == src["compute_fraction"]
    assert load_profile("h100-sxm").overheads["sm_share"]["bw_fraction"] == out["bw_fraction"]
    # other SMs (H20: 78, RTX 4090: 128 Ada SMs): nothing carried over
    assert "sm_share" not in load_profile("h20").overheads
    assert "sm_share" not in load_profile("rtx4090").overheads
