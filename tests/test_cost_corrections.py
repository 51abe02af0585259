"""Corrections of summed kernel times learned from real runs: the unequal-context term of the
split-K decode kernel and the in-situ factors (GPU forward passes, CPU iterations)."""
import dataclasses

import numpy as np
import pytest

from simserve.cost import BatchShape, GpuCostModel, in_situ_factor
from simserve.cost.cpu import CpuCostModel
from simserve.hardware.attention import SplitImbalance
from simserve.hardware.profile import load_profile
from simserve.models import get_model
from simserve.realcheck.fit import apply, fit_log_factor

P = {"target_programs": 528, "min_split_tokens": 256, "block_n": 64, "kv_heads": 8,
     "program_tokens_per_us": 28.0}


def test_split_count_follows_the_kernel_heuristic():
    imb = SplitImbalance(P)
    # 1 sequence x 8 KV heads: ceil(528/8) = 66 splits wanted, but no split under 256 tokens:
    # 32768 tokens -> min(66, 128) = 66 splits of ceil(32768/66) = 497 -> 512 (block 64)
    assert imb.longest(1, 32768) == 512
    # 74 sequences fill 592 >= 528 programs: one split, the whole longest context
    assert imb.longest(74, 16165) == 16165
    # a context shorter than a split is its own length
    assert imb.longest(4, 100) == 100


def test_equal_contexts_leave_the_grid_unchanged_and_unequal_cost_more():
    imb = SplitImbalance(P)
    assert imb.factor(16, 16 * 4000, 4000, 80.0) == pytest.approx(1.0, abs=1e-12)
    f = [float(imb.factor(74, 326616, m, 400.0)) for m in (4414, 8000, 12000, 16165)]
    assert f[0] == pytest.approx(1.0, abs=1e-12)  # ΣC/B rounded up is the equal-context case
    assert all(b > a for a, b in zip(f, f[1:]))
    # the longest program dominates: 16165 tokens at 28/µs = 577 µs, 1.44x the 400 µs grid
    assert f[-1] == pytest.approx(np.sqrt(1 + (16165 / 28 / 400) ** 2)
                                  / np.sqrt(1 + (4414 / 28 / 400) ** 2))


def test_cost_model_prices_unequal_contexts_through_the_batch_shape():
    cost = GpuCostModel(get_model("llama-3.1-8b"), load_profile("h200-sxm"))
    ctx = np.array([1000] * 63 + [16000])
    eq = BatchShape(num_tokens=64, num_decodes=64, decode_ctx_sum=int(ctx.sum()),
                    num_sample_rows=64)
    uneq = dataclasses.replace(eq, decode_ctx=ctx)
    assert cost.step_s(uneq) > 1.05 * cost.step_s(eq)
    # array and scalar paths agree to the bit (event leaping relies on it)
    S = np.array([int(ctx.sum()), int(ctx.sum()) + 64])
    arr = cost.decode_only_s(64, S, np.array([16000, 16001]))
    assert arr[0] == cost.decode_only_s(64, int(S[0]), 16000)
    assert arr[1] == cost.decode_only_s(64, int(S[1]), 16001)


def test_in_situ_factor_interpolates_in_log_tokens_and_is_flat_outside():
    m = {"tokens": [16, 256], "factor": [0.9, 1.1]}
    f = in_situ_factor(m, np.array([1, 16, 64, 256, 4096]))
    np.testing.assert_allclose(f, [0.9, 0.9, 1.0, 1.1, 1.1])
    assert (in_situ_factor(None, np.array([1, 5])) == 1).all()


def test_fit_recovers_a_known_factor():
    rng = np.random.default_rng(0)
    T = np.round(np.exp(rng.uniform(0, np.log(16384), 400)))  # every knot interval sampled
    true = np.array([0.95, 0.95, 0.96, 1.02, 1.06, 1.04, 1.02])
    pred = rng.uniform(1e3, 1e5, 400)
    meas = apply(T, pred, true)
    np.testing.assert_allclose(fit_log_factor(T, meas, pred), true, rtol=1e-9)


def test_cpu_in_situ_scales_every_stage_but_the_host_overhead():
    prof = load_profile("xeon-emr")
    oh = {k: v for k, v in prof.overheads.items() if k != "in_situ"}
    bare = dataclasses.replace(prof, overheads=oh, _ops_cache={})
    doubled = dataclasses.replace(prof, overheads=dict(oh, in_situ={"tokens": [1], "factor": [2.0]}),
                                  _ops_cache={})
    m = get_model("llama-3.1-8b")
    a, b = CpuCostModel(m, bare, 16).stage_us(8, 8000), CpuCostModel(m, doubled, 16).stage_us(8, 8000)
    host = float(oh.get("iteration_us", 0)) + float(oh.get("per_seq_us", 0)) * 8
    for k in ("pre_attention", "attention", "post_attention", "post_layer"):
        assert b[k] == pytest.approx(2 * a[k])
    assert b["pre_layer"] - host == pytest.approx(2 * (a["pre_layer"] - host))
