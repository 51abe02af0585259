"""Validation plumbing (torch-free): held-out batch generation, error statistics, and the
replay harness, checked with a stand-in executor whose answers we know."""
import numpy as np
import pandas as pd
import pytest

from simserve.cost import GpuCostModel
from simserve.hardware.profile import load_profile
from simserve.hardware.setup import HardwareConfig
from simserve.models import get_model
from simserve.realcheck import batches as vb
from simserve.realcheck.replay import compare, run_pair, shape_to_batch
from simserve.realcheck.score import summary
from simserve.workload.build import build_workload


def test_gpu_batches_respect_the_issue_ranges():
    bs = vb.gpu_batches(150, seed=3, max_tokens=16384, max_kv_tokens=800_000)
    assert {b["kind"] for b in bs} == {"prefill", "decode", "mixed"}
    for b in bs:
        assert sum(b["chunks"]) + len(b["decode_ctx"]) <= 16384
        assert all(32 <= c <= 8192 for c in b["chunks"])
        assert all(c == 0 or 1024 <= c <= 16384 for c in b["chunk_ctx"])
        assert len(b["decode_ctx"]) <= 256 and sum(b["decode_ctx"]) <= 800_000
        assert all(1024 <= c <= 16384 for c in b["decode_ctx"])
        if b["kind"] == "decode":
            assert not b["chunks"] and b["decode_ctx"]
        if b["kind"] == "mixed":
            assert len(b["chunks"]) == 1 and b["decode_ctx"]
    assert vb.gpu_batches(10, seed=3) == bs[:10]  # deterministic by seed


def test_cpu_batches_respect_ranges():
    for b in vb.cpu_batches(100, seed=4, max_cpu_kv_tokens=400_000):
        assert 1 <= b["batch"] <= 256 and 64 <= b["context"] <= 8192
        assert b["batch"] * b["context"] <= 400_000


def test_shape_roundtrip():
    b = {"kind": "mixed", "chunks": [300], "chunk_ctx": [2000], "chunk_sample": [True],
         "decode_ctx": [1500, 4000, 1024]}
    s = vb.to_shape(b)
    assert (s.num_tokens, s.num_decodes, s.decode_ctx_sum, s.num_sample_rows) == (303, 3, 6524, 4)
    assert shape_to_batch(s) == b | {"kind": "replay"}


def test_prediction_excludes_only_the_scheduler_overhead():
    cost = GpuCostModel(get_model("llama-3.1-8b"), load_profile("h200-sxm"))
    b = vb.gpu_batches(3, seed=5)[1]
    s = vb.to_shape(b)
    n = s.num_prefills + s.num_decodes
    oh = load_profile("h200-sxm").overheads
    assert cost.step_s(s) - vb.predict_gpu_us(cost, b) * 1e-6 == pytest.approx(
        (oh["iteration_us"] + oh["per_seq_us"] * n) * 1e-6, rel=1e-9)


def test_error_summary_on_known_numbers():
    df = pd.DataFrame({"kind": ["a", "a", "b"], "predicted_us": [110.0, 90.0, 300.0],
                       "measured_us": [100.0, 100.0, 200.0]})
    s = summary(df)
    assert s["all"]["mape_pct"] == pytest.approx((10 + 10 + 50) / 3)
    assert s["a"]["mean_signed_pct"] == pytest.approx(0.0)
    assert s["b"]["max_ape_pct"] == pytest.approx(50.0)


def _workload():
    return build_workload("synthetic-conversation", num_requests=60, arrival="poisson",
                          rate=20.0, seed=3)


def test_replay_with_an_executor_that_answers_like_the_cost_model_matches_the_simulation():
    cost = GpuCostModel(get_model("llama-3.1-8b"), load_profile("h200-sxm"),
                        graph_max_tokens=1 << 20)
    res = run_pair(_workload(), "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"),
                   measure=lambda b: vb.predict_gpu_us(cost, b))
    sim, real = res["sim"]["records"], res["real"]["records"]
    np.testing.assert_allclose(real.token_times_s, sim.token_times_s, rtol=0, atol=1e-9)
    assert len(res["real"]["log"]) == res["real"]["iterations"]
    assert all(abs(r["error_pct"]) < 1e-6 for r in compare(res["sim"]["summary"],
                                                            res["real"]["summary"]))


def test_replay_with_a_slower_executor_shows_up_in_the_comparison():
    cost = GpuCostModel(get_model("llama-3.1-8b"), load_profile("h200-sxm"),
                        graph_max_tokens=1 << 20)
    res = run_pair(_workload(), "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"),
                   measure=lambda b: 1.3 * vb.predict_gpu_us(cost, b))
    rows = {r["metric"]: r for r in compare(res["sim"]["summary"], res["real"]["summary"])}
    # the simulation is faster than the (30 % slower) executor: it underestimates latency
    assert rows["mean_tpot_ms"]["error_pct"] < -10
    assert rows["mean_ttft_ms"]["error_pct"] < -10
