"""CPU decode cost model (simserve/cost/cpu.py) against the shipped CPU profiles."""
from __future__ import annotations

import numpy as np
import pytest

from simserve.cost.cpu import CpuCostModel, host_copy_gbps
from simserve.errors import ConfigError
from simserve.hardware.profile import load_profile
from simserve.models import get_model

LLAMA = get_model("llama-3.1-8b")
CASES = [("xeon-silver-4510", "llama-3.1-8b", 12, 1), ("xeon-silver-4510", "qwen3-14b", 24, 2),
         ("xeon-emr", "llama-3.1-8b", 16, 1), ("xeon-8469c", "qwen3-32b", 48, 2)]


def _cm(prof, model, cores, tp, **kw):
    return CpuCostModel(get_model(model), load_profile(prof), cores, tp, **kw)


@pytest.mark.parametrize("case", CASES)
def test_stages_add_up_to_the_iteration(case):
    cm = _cm(*case)
    for b in (1, 7, 64, 256):
        for ctx in (b * 100, b * 3000):
            s = cm.stage_us(b, ctx)
            total = s["pre_layer"] + cm.num_layers * (
                s["pre_attention"] + s["attention"] + s["post_attention"]) + s["post_layer"]
            assert cm.iteration_s(b, ctx) == pytest.approx(total * 1e-6, rel=1e-12)
            assert all(v > 0 for v in s.values())


@pytest.mark.parametrize("case", CASES)
def test_monotone_in_batch_and_context_sum(case):
    cm = _cm(*case)
    for ctx in (128, 1024, 8192):   # per-request context fixed, batch grows
        t = [cm.iteration_s(b, b * ctx) for b in range(1, 520, 3)]
        assert np.all(np.diff(t) >= 0)
    for b in (1, 16, 256):          # batch fixed, context sum grows
        t = cm.iteration_s(b, np.linspace(b, b * 20000, 300))
        assert np.all(np.diff(t) >= 0)


def test_array_context_sums_give_the_scalar_floats():
    cm = _cm("xeon-silver-4510", "llama-3.1-8b", 24, 2)
    ctx = np.array([40, 999, 5000, 77777, 300000])
    got = cm.iteration_s(32, ctx)
    assert [float(g) for g in got] == [cm.iteration_s(32, int(c)) for c in ctx]


def test_cpu_tp2_halves_weight_streaming_at_batch_1():
    # DualPace §6.3: TP1 = 12 cores, TP2 = two NUMA-local ranks of 12 cores each.
    one = _cm("xeon-silver-4510", "llama-3.1-8b", 12, 1)
    two = _cm("xeon-silver-4510", "llama-3.1-8b", 24, 2)
    # the GEMM shard model is linear in 1/cpu_tp on the same per-rank tables: exact
    assert two.gemm_us(1) == pytest.approx(one.gemm_us(1) / 2, rel=1e-12)
    assert two.lm_head_us(1) == pytest.approx(one.lm_head_us(1) / 2, rel=1e-12)
    # the whole per-layer dense path adds what does not halve: two Gloo all-reduces of one
    # 8 KiB row (2 x ~40 us) and ~0.2 us of norms, i.e. < 10% of the 12-core layer's 2.58 ms
    r = (two.pre_attention_us(1) + two.post_attention_us(1)) / (
        one.pre_attention_us(1) + one.post_attention_us(1))
    assert 0.5 < r < 0.5 + 0.1
    # a larger Gloo latency eats the gain proportionally
    slow = _cm("xeon-silver-4510", "llama-3.1-8b", 24, 2, gloo_latency_us=400.0)
    assert slow.post_attention_us(1) - two.post_attention_us(1) == pytest.approx(2 * 360.0)


def test_missing_core_counts_are_clear_errors():
    with pytest.raises(ConfigError, match=r"6 cores per rank.*\[12\]"):
        _cm("xeon-silver-4510", "llama-3.1-8b", 12, 2)
    with pytest.raises(ConfigError, match=r"\[24, 48\]"):
        _cm("xeon-8469c", "llama-3.1-8b", 32, 1)
    with pytest.raises(ConfigError, match="divide"):
        _cm("xeon-emr", "llama-3.1-8b", 12, 5)
    with pytest.raises(ConfigError, match="expected a cpu"):
        CpuCostModel(LLAMA, load_profile("h100-sxm"), 12)


def test_one_point_equals_the_tables_composed_by_hand():
    cm = _cm("xeon-silver-4510", "llama-3.1-8b", 12, 1)
    bw = 144.0e3  # bytes/us: min(281.6 GB/s x 0.70, 12 cores x 12 GB/s), the derived target
    assert cm.host_gbps == pytest.approx(144.0)
    b, ctx = 16, 16 * 1024         # on the knots: tokens 16, decode grid (16, 1024)
    h, ffn, V, L = 4096, 14336, 128256, 32
    pre_layer = 200.0 + 2.0 * b + b * h * 2 / bw
    pre_attn = 369.926 + (2 * b * h * 2 + (32 + 8) * 128 * b * 2 + 2 * 8 * 128 * b * 2) / bw
    attn = 828.703
    post_attn = 282.688 + 1494.58 + 954.127 + (2 * b * h * 2 + 1.5 * b * ffn * 2) / bw
    post_layer = 2 * b * h * 2 / bw + 6392.38 + b * V * 4 / bw
    s = cm.stage_us(b, ctx)
    for k, v in dict(pre_layer=pre_layer, pre_attention=pre_attn, attention=attn,
                     post_attention=post_attn, post_layer=post_layer).items():
        assert s[k] == pytest.approx(v, rel=1e-9), k
    expect = pre_layer + L * (pre_attn + attn + post_attn) + post_layer
    assert cm.iteration_s(b, ctx) == pytest.approx(expect * 1e-6, rel=1e-9)


def test_measured_profile_uses_the_raw_copy_ceiling():
    gbps, src = host_copy_gbps(load_profile("xeon-emr"), 12)
    assert "measured" in src
    assert gbps == pytest.approx(51.1, abs=0.05)   # the ceiling xeon-silver-4510 cites


def test_assist_routes_use_the_cpu_stages():
    cm = _cm("xeon-silver-4510", "llama-3.1-8b", 12, 1)
    gpu_ops = load_profile("rtx4090").ops("llama-3.1-8b", 1)
    B = [1, 16, 32, 256]
    rt = cm.assist_route_times(gpu_ops, load_profile("pcie4-x16"), B)
    assert np.allclose(rt.t_p, [cm.post_attention_us(b) / 1e3 for b in B])
    assert np.allclose(rt.t_l, [cm.post_layer_us(b) / 1e3 for b in B])
    assert np.all(rt.tw_p > 0)


def test_a_model_fitted_on_its_own_runs_uses_its_own_in_situ_factor():
    """xeon-emr carries a factor fitted on Llama-3.1-8B runs and one fitted on Qwen3-14B's
    (`overheads.in_situ.by_model`); each model gets its own, others the profile's."""
    from simserve.cost import in_situ_factor
    prof = load_profile("xeon-emr")
    situ = prof.overheads["in_situ"]
    own = situ["by_model"]["qwen3-14b"]
    qwen = CpuCostModel(get_model("qwen3-14b"), prof, 16)
    llama = CpuCostModel(get_model("llama-3.1-8b"), prof, 16)
    for b in (1, 8, 200):
        assert qwen.in_situ(b) == pytest.approx(float(in_situ_factor(own, np.array([b]))[0]))
        assert llama.in_situ(b) == pytest.approx(float(in_situ_factor(situ, np.array([b]))[0]))
    assert qwen.in_situ(64) != pytest.approx(llama.in_situ(64), rel=0.05)
