"""Conflux Parallelism validation plumbing (torch-free): SP batch generation, the estimator's
α/β calibration, and scoring of a measurement folder whose answers we know."""
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from simserve.errors import SimserveError
from simserve.policies.conflux.estimator import (ConfluxEstimator, estimate_many,
                                                 fit_contention)
from simserve.realcheck import sp_score
from simserve.realcheck.sp_batches import as_row, estimator_inputs, predict_sp, sample_rows, sp_batches


def test_sp_batches_shard_the_chunks_and_keep_every_rank_busy():
    bs = sp_batches(100, ranks=2, seed=5)
    assert {b["kind"] for b in bs} == {"mixed", "prefill", "decode"}
    for b in bs:
        assert sum(b["shards"]) == sum(b["chunks"]) <= 12288
        assert all(s + len(d) >= 1 for s, d in zip(b["shards"], b["decode_ctx"]))
        assert all(1024 <= c <= 16384 for d in b["decode_ctx"] for c in d)
        assert all(len(d) <= 128 for d in b["decode_ctx"])
        if b["kind"] == "prefill":
            assert not any(b["decode_ctx"])
        if b["kind"] == "decode":
            assert not b["chunks"] and all(b["decode_ctx"])
    assert sp_batches(10, ranks=2, seed=5) == bs[:10]


def test_sample_rows_follow_the_shard_holding_each_chunk_end():
    b = {"chunks": [100, 50], "chunk_sample": [True, True], "shards": [120, 30],
         "decode_ctx": [[2000, 3000], []]}
    # chunk ends at tokens 100 (rank 0) and 150 (rank 1)
    assert sample_rows(b, 0) == 1 + 2 and sample_rows(b, 1) == 1


def test_estimate_many_matches_iteration_time_and_fit_recovers_contention():
    est = ConfluxEstimator(gamma=1e-7, gamma0=1e-5, a_d=2e-9, a_d0=5e-6, a_comm=1e-8,
                           a_comm0=8e-6, a_p=1e-12, a_p0=5e-6, alpha=1.3, beta=1.15,
                           num_layers=32)
    bs = [estimator_inputs(b) for b in sp_batches(60, ranks=2, seed=2)]
    paths = np.array([est.paths(x["n_p"], x["n_d"], x["dctx"], x["prefills"]) for x in bs])
    truth = np.array([est.iteration_time(x["n_p"], x["n_d"], x["dctx"], x["prefills"]) for x in bs])
    np.testing.assert_allclose(estimate_many(est, paths, 1.3, 1.15)[:, 0], truth, rtol=1e-12)
    # iterations produced by the same form with α 1.3, β 1.15: the grid search finds a pair
    # that reproduces them (β is identifiable only where β·T_P sets the region)
    a, b = fit_contention(est, paths, truth)
    np.testing.assert_allclose(estimate_many(est, paths, a, b)[:, 0], truth, rtol=2e-3)
    # Eq. 2 to the letter applies β to every lone prefill: there it is recovered
    lit = dataclasses.replace(est, literal=True)
    truth = np.array([lit.iteration_time(x["n_p"], x["n_d"], x["dctx"], x["prefills"]) for x in bs])
    assert fit_contention(lit, paths, truth) == pytest.approx((1.3, 1.14), abs=0.021)


def _folder(tmp_path, scale_mixed=1.0):
    cost, est = sp_score.models("qwen3-14b", "h200-sxm", "nvlink4", 2, 1.28, 1.28)
    rows = []
    for b in sp_batches(40, ranks=2, seed=9):
        p = predict_sp(cost, est, b)
        m = p["predicted_us"] * (scale_mixed if b["kind"] == "mixed" else 1.0)
        rows.append({**as_row(b), "overlap_graph_us": m, "overlap_queued_us": m,
                     "serial_queued_us": m * 1.1, "linear_queued_us": m * 0.6})
    pd.DataFrame(rows).to_csv(tmp_path / "sp_iterations.csv", index=False)
    return tmp_path


def test_score_of_measurements_equal_to_the_cost_model_is_exact(tmp_path):
    r = sp_score.score(str(_folder(tmp_path)), "qwen3-14b", out_dir=str(tmp_path))
    assert r["cost_model_paper_ab"]["all"]["mape_pct"] < 1e-9
    assert r["n_graph"] == 40
    assert json.loads((tmp_path / "sp_summary.json").read_text())["model"] == "qwen3-14b"


def test_score_sees_slower_mixed_iterations(tmp_path):
    r = sp_score.score(str(_folder(tmp_path, scale_mixed=1.25)), "qwen3-14b")
    s = r["cost_model_paper_ab"]
    assert s["mixed"]["mean_signed_pct"] == pytest.approx(-20.0, abs=1e-6)  # 1/1.25 - 1
    assert s["prefill"]["mape_pct"] < 1e-9
    # a larger contention factor explains part of the gap, on held-out halves too
    assert r["cost_model_heldout_ab"]["mixed"]["mape_pct"] < s["mixed"]["mape_pct"]


def test_score_names_a_wrong_folder(tmp_path):
    with pytest.raises(SimserveError, match="sp_iterations.csv"):
        sp_score.load(str(tmp_path))


def test_conflux_takes_measured_contention_from_the_profile():
    from simserve.cost.sp import PAPER_CONTENTION
    from simserve.hardware.profile import load_profile
    from simserve.policies.conflux.config import ConfluxConfig
    from simserve.policies.conflux.policy import contention
    h200, h100 = load_profile("h200-sxm", "gpu"), load_profile("h100-sxm", "gpu")
    measured = h200.overheads["sp_contention"]
    assert measured["alpha"] >= 1.0 and measured["beta"] >= 1.0
    assert contention(ConfluxConfig(), h200) == (measured["alpha"], measured["beta"])
    derived = h100.overheads["sp_contention"]   # rescaled from the H200 (hardware/rescale.py)
    assert contention(ConfluxConfig(), h100) == (derived["alpha"], derived["beta"])
    assert contention(ConfluxConfig(alpha="paper", beta="paper"), h100) == \
        (PAPER_CONTENTION, PAPER_CONTENTION)                         # the named what-if
    assert contention(ConfluxConfig(alpha=1.5, beta=1.1), h200) == (1.5, 1.1)
