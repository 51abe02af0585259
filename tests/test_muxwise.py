"""`muxwise`: SM-share scaling, the TBT-driven SM choice, isolated timing, completion, KV bounds."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.cost import GpuCostModel
from simserve.errors import ConfigError
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.policies.muxwise.config import MuxWiseConfig
from simserve.cost.smshare import CONTENTION_FIG14A, SmShareCost, contention
from simserve.run import simulate_point
from tests.helpers import assert_every_token_in_order, requests, workload

H100X4 = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
MODEL = "llama-3.1-8b"


def _share_cost(bw_sat=0.5):
    return SmShareCost(GpuCostModel(get_model(MODEL), H100X4.gpu, 4, H100X4.nvlink), bw_sat)


def test_contention_default_is_fig14a():
    # 36.5 ms serial, 28.0 ms overlapped, 58 % of the gap to the ideal closed
    ideal = 36.5 - 8.5 / 0.58
    assert CONTENTION_FIG14A == pytest.approx(28.0 / ideal, abs=1e-3)
    assert 1.27 < CONTENTION_FIG14A < 1.29


def test_sm_share_scales_compute_by_share_and_memory_by_bandwidth_share():
    c = _share_cost(bw_sat=0.5)
    # memory-bound kernel of 104 us: floor 4 us kept, the rest / bw(0.25) = / 0.5
    assert c._scaled(104.0, 0.0, 1e6, 0.25) == pytest.approx(4.0 + 100.0 * 2.0)
    # above saturation a memory-bound kernel keeps its time
    assert c._scaled(104.0, 0.0, 1e6, 0.6) == pytest.approx(104.0)
    # compute-bound kernel on a third of the SMs: 3x its roofline part
    assert c._scaled(104.0, 1e12, 1.0, 1 / 3) == pytest.approx(4.0 + 300.0)
    # a GEMM of 8192 tokens (compute-bound on H100: ridge ~295 FLOP/B) scales ~1/f
    g = c.gemms["gate_up"]
    t = 500.0
    assert c._gemm(g, t, 8192, 0.5) == pytest.approx(4.0 + 496.0 * 2.0, rel=1e-9)


@pytest.mark.parametrize("tbt_ms,expected", [(4.0, 24), (2.0, 48), (1.0, 64), (100.0, 16)])
def test_decode_gets_the_fewest_sms_meeting_the_tbt(tbt_ms, expected):
    e = _engine(MuxWiseConfig(tbt_ms=tbt_ms, decode_contention=CONTENTION_FIG14A))
    # hand-made decode time: 66 ms·SM / sms, i.e. 0.5 ms on all 132 SMs; alpha = 1.28:
    # 1.28·66/s <= TBT  ->  s >= 84.5/TBT; groups are 16, 24, ..., 64 SMs
    e.cost.decode_step_s = lambda b, ctx, f, ctx_max=None: 66.0 / (f * 132) * 1e-3
    assert e.decode_sms(8, 8000) == expected


def _engine(cfg):
    import simpy

    from simserve.policies.muxwise.engine import MuxWiseEngine
    from simserve.sim.cluster import Cluster
    from simserve.sim.context import ArrivalSource, Recorder, SimContext
    from simserve.sim.requests import RequestTable
    env = simpy.Environment()
    hw = H100X4
    w = workload([0.0], [10], [2])
    table = RequestTable(w)
    ctx = SimContext(env, get_model(MODEL), hw,
                     Cluster.build(env, hw.gpu, hw.num_gpus, hw.pcie, hw.nvlink), table,
                     ArrivalSource(env, table.arrival), Recorder(), np.random.default_rng(0))
    return MuxWiseEngine(ctx, cfg, 0, [0, 1, 2, 3])


def test_isolated_request_runs_alone_on_every_sm():
    p = 4000
    res = simulate_point(workload([0.0], [p], [3]), MODEL, H100X4, "muxwise")
    cost = GpuCostModel(get_model(MODEL), H100X4.gpu, 4, H100X4.nvlink)
    tt = res.records.token_times(0)
    assert tt[0] == pytest.approx(cost.prefill_only_s(p), rel=1e-12)
    assert tt[1] - tt[0] == pytest.approx(cost.decode_only_s(1, p + 1), rel=1e-12)
    assert tt[2] - tt[1] == pytest.approx(cost.decode_only_s(1, p + 2), rel=1e-12)


def test_prefill_next_to_decode_is_slower_and_decode_meets_tbt():
    # request 0 decodes for a long time; request 1's prefill runs beside it (the analytic
    # share model and the Fig. 14a contention, configured)
    w = workload([0.0, 0.05], [1000, 8000], [400, 2])
    res = simulate_point(w, MODEL, H100X4, "muxwise", tbt_ms=50.0, bw_saturation=0.5,
                         decode_contention=CONTENTION_FIG14A, prefill_contention=CONTENTION_FIG14A)
    cost = GpuCostModel(get_model(MODEL), H100X4.gpu, 4, H100X4.nvlink)
    ttft1 = res.records.first_token_s[1] - 0.05
    # at least beta x the full-GPU prefill (a smaller share is slower still), plus at most one
    # decode step of waiting for a step boundary
    assert ttft1 > CONTENTION_FIG14A * cost.prefill_only_s(8000)
    gaps = np.diff(res.records.token_times(0))
    assert gaps.max() <= 0.050 + 1e-12
    # and the gaps while the prefill ran are alpha x a share-limited step: longer than alone
    assert gaps.max() > CONTENTION_FIG14A * cost.decode_only_s(1, 1400)


@st.composite
def scenarios(draw):
    w, prompt, output, need = draw(requests(25, 3000, 150, 0.3))
    return w, dict(
        num_gpu_blocks_override=draw(st.integers(need, 3 * need)),
        prefill_max_tokens=draw(st.sampled_from([512, 8192])),
        scheduler=draw(st.sampled_from(["fcfs", "srpt"])),
        tbt_ms=draw(st.sampled_from([5.0, 50.0])))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_finishes_and_kv_stays_within_the_pool(sc):
    w, params = sc
    res = simulate_point(w, MODEL, H100X4, "muxwise", **params)
    assert res.stats["peak_kv_blocks"][0] <= params["num_gpu_blocks_override"]
    assert res.stats["kv_blocks_in_use_at_end"] == [0]
    rec = res.records
    assert_every_token_in_order(rec, w)
    stepped = simulate_point(w, MODEL, H100X4, "muxwise", leap=False, **params)
    assert np.array_equal(rec.token_times_s, stepped.records.token_times_s)


def test_bad_configs_name_the_field():
    w = workload([0.0], [10], [2])
    with pytest.raises(ConfigError, match="decode_contention"):
        simulate_point(w, MODEL, H100X4, "muxwise", decode_contention=0.5)
    with pytest.raises(ConfigError, match="bw_saturation"):
        simulate_point(w, MODEL, H100X4, "muxwise", bw_saturation=0)
    with pytest.raises(ConfigError, match="tp"):
        simulate_point(w, MODEL, H100X4, "muxwise", tp=3)


def test_real_profile_choice_is_minimal_and_shrinks_as_the_tbt_loosens():
    chosen = []
    for tbt in (8.0, 12.0, 20.0, 50.0):
        e = _engine(MuxWiseConfig(tbt_ms=tbt))
        B, S = 64, 64 * 4096
        sms = e.decode_sms(B, S)
        step = lambda s: e.contention(s / 132)[0] * e.cost.decode_step_s(B, S, s / 132)  # noqa: E731
        if sms != 64:
            assert step(sms) <= tbt / 1e3
        if sms > 16:  # the next smaller group misses the TBT
            assert step(sms - 8) > tbt / 1e3
        chosen.append(sms)
    assert chosen == sorted(chosen, reverse=True) and chosen[0] > chosen[-1]


def test_measured_sharing_curves_are_the_profile_default_and_a_number_forces_analytic():
    share = H100X4.gpu.overheads["sm_share"]
    e = _engine(MuxWiseConfig())
    assert e.cost.curves is share
    f = 16 / 132
    a, b = e.contention(f)
    assert a == pytest.approx(np.interp(f, share["corun_decode_fraction"], share["decode_contention"]))
    assert b == pytest.approx(np.interp(f, share["corun_decode_fraction"], share["prefill_contention"]))
    assert e.cost.bw(f) == pytest.approx(np.interp(f, share["sm_fraction"], share["bw_fraction"]))
    forced = _engine(MuxWiseConfig(bw_saturation=0.5, decode_contention=1.5))
    assert forced.cost.curves is None and forced.cost.bw(0.25) == pytest.approx(0.5)
    assert forced.contention(f) == (1.5, pytest.approx(b))  # beta still measured
    assert contention(None, f) == (CONTENTION_FIG14A, CONTENTION_FIG14A)


def test_measured_curves_scale_memory_and_compute_bound_kernels_by_their_own_share():
    curves = {"sm_fraction": [0.25, 0.5, 1.0], "bw_fraction": [0.5, 0.8, 1.0],
              "compute_fraction": [0.3, 0.55, 1.0]}
    c = SmShareCost(GpuCostModel(get_model(MODEL), H100X4.gpu, 4, H100X4.nvlink), 0.5, curves)
    assert c._scaled(104.0, 0.0, 1e6, 0.25) == pytest.approx(4.0 + 100.0 / 0.5)
    assert c._scaled(104.0, 1e12, 1.0, 0.25) == pytest.approx(4.0 + 100.0 / 0.3)
    # linear between knots, from (0, 0)
    assert c.bw(0.375) == pytest.approx(0.65) and c.compute(0.125) == pytest.approx(0.15)
