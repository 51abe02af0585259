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


def _rows(known: dict, alpha, beta, total=132, sms=(16, 32, 64)) -> pd.DataFrame:
    """Rows as `calibrate.smshare` writes them, timed by `SmShareCost` itself with `known`
    curves (Qwen3-14B at TP4 shapes on the h200-sxm profile), and co-run slowdowns alpha(f),
    beta(f)."""
    costs = smshare_fit._Costs()
    rows = []
    for s in sms:
        rows += [dict(kind="decode_alone", decode_sms=s, decode_batch=b, decode_ctx=c)
                 for b, c in ((96, 8192), (32, 4096), (512, 1536))]
        rows += [dict(kind="prefill_alone", prefill_sms=s, prefill_chunk=ch, prefill_ctx=c)
                 for ch, c in ((8192, 0), (2048, 8192))]
        rows.append(dict(kind="corun_decode", decode_sms=s, ratio=alpha(s / total),
                         note="5/5 runs covered; 2 prefill and 9 decode passes"))
        rows.append(dict(kind="corun_prefill", decode_sms=s, ratio=beta(s / total)))
    d = pd.DataFrame(rows)
    d["model"], d["shard"], d["total"], d["run"] = "qwen3-14b", 4, total, "r"
    d["full_depth"] = False
    for i, r in enumerate(d.itertuples()):
        if r.kind.endswith("_alone"):
            f = (r.decode_sms if r.kind == "decode_alone" else r.prefill_sms) / total
            d.loc[i, "ratio"] = costs.ratio(r, f, known)
    return d


def test_curves_recover_the_shares_that_generated_the_timings():
    f = np.array([16, 32, 64]) / 132
    known = {"sm_fraction": [*f, 1.0], "bw_fraction": [0.35, 0.6, 0.9, 1.0],
             "compute_fraction": [0.16, 0.3, 0.55, 1.0]}
    d = _rows(known, lambda x: 1.1 + x, lambda x: 1.0 + x / 2)
    c = smshare_fit.curves(d)
    assert c["sm_fraction"] == pytest.approx(known["sm_fraction"], abs=1e-4)
    assert c["bw_fraction"] == pytest.approx(known["bw_fraction"], rel=0.01)
    assert c["compute_fraction"] == pytest.approx(known["compute_fraction"], rel=0.01)
    assert c["decode_contention"] == pytest.approx(1.1 + f, abs=1e-4)
    assert c["prefill_contention"] == pytest.approx(1.0 + f / 2, abs=1e-4)


def test_curves_are_monotone_and_capped():
    # a measured dip (wave quantisation) and a point above the whole GPU
    assert smshare_fit._monotone([0.3, 1.05, 0.9, 1.0]) == [0.3, 1.0, 1.0, 1.0]


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


def test_slowdowns_come_from_full_depth_runs_when_there_are_any():
    rows = [dict(kind=k, decode_sms=16, ratio=r, full_depth=fd)
            for k, r, fd in (("corun_decode", 1.1, False), ("corun_prefill", 1.02, False),
                             ("corun_decode", 1.2, True), ("corun_prefill", 1.1, True))]
    d = pd.DataFrame(rows)
    assert sorted(smshare_fit._corun(d).ratio) == [1.1, 1.2]
    assert sorted(smshare_fit._corun(d[~d.full_depth]).ratio) == [1.02, 1.1]
