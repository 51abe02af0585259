"""Exact event leaping in `muxwise`: decode-alone stretches and split steps (decode on its SM
share while the prefill batch advances on the rest) leapt (leap: true) give byte-identical
per-token times, SM choices and KV peaks to stepping every decode step (leap: false); the
vectorised SM-share step prices are the scalar ones."""
from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.cost import GpuCostModel
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.policies.muxwise.engine import MuxWiseEngine
from simserve.cost.mux_share import MuxShareCost
from simserve.cost.smshare import SmShareCost
from simserve.run import simulate_point
from tests.helpers import assert_run_complete, requests

H100X4 = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
EXAMPLES = int(os.environ.get("MUXWISE_EXAMPLES", 40))


@st.composite
def scenarios(draw):
    busy = draw(st.booleans())
    w, prompt, output, need = draw(requests(40, 8000, 400, 0.05) if busy else
                                   requests(25, 8000, 300, 0.4))
    return w, dict(
        num_gpu_blocks_override=draw(st.integers(need, 4 * need)),
        prefill_max_tokens=draw(st.sampled_from([512, 8192, 16384])),
        scheduler=draw(st.sampled_from(["fcfs", "srpt"])),
        tbt_ms=draw(st.sampled_from([5.0, 20.0, 50.0, 100.0])),
        bw_saturation=draw(st.sampled_from([None, 0.5])),
        tp=draw(st.sampled_from([2, 4])))


def _run(w, model, **params):
    """The point, and its engines (for their split-step counters)."""
    engines = []
    init = MuxWiseEngine.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        engines.append(self)
    MuxWiseEngine.__init__ = spy
    try:
        return simulate_point(w, model, H100X4, "muxwise", **params), engines
    finally:
        MuxWiseEngine.__init__ = init


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(["llama-3.1-8b", "qwen3-14b"]))
def test_leaping_matches_stepping_exactly(sc, model):
    w, params = sc
    a, ea = _run(w, model, **params)
    b, eb = _run(w, model, leap=False, **params)
    assert_run_complete(a, w, params["num_gpu_blocks_override"])
    for f in ("token_times_s", "first_token_s", "finish_s", "num_preemptions"):
        assert np.array_equal(getattr(a.records, f), getattr(b.records, f)), f
    for key in ("sim_end_s", "num_iterations", "peak_kv_blocks"):
        assert a.stats[key] == b.stats[key], key
    sa = [(e.num_split_steps, e.decode_sms_sum, e.left, e.clock) for e in ea]
    sb = [(e.num_split_steps, e.decode_sms_sum, e.left, e.clock) for e in eb]
    assert sa == sb
    assert a.stats["num_iterations_stepped"] <= b.stats["num_iterations_stepped"]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 256), st.integers(1, 30000), st.integers(0, 4000),
       st.sampled_from([16 / 132, 24 / 132, 0.25, 64 / 132, 1.0]), st.sampled_from([None, 0.5]),
       st.integers(1, 40))
def test_vectorised_step_prices_are_the_scalar_ones(b, per_seq, extra, f, bw_sat, n):
    hw = H100X4
    cost = GpuCostModel(get_model("qwen3-14b"), hw.gpu, 4, hw.nvlink)
    c = SmShareCost(cost, bw_sat or 0.5,
                    curves=hw.gpu.overheads.get("sm_share") if bw_sat is None else None)
    steps = np.arange(n, dtype=np.int64)
    S = b * per_seq + extra + b * steps
    M = per_seq + extra + 1 + steps
    got = c.decode_steps_s(b, S, f, M).tolist()
    want = [c.decode_step_s(b, int(s), f, int(m)) for s, m in zip(S, M)]
    assert got == want


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 256), st.integers(1, 30000), st.integers(0, 4000),
       st.sampled_from([16 / 132, 24 / 132, 0.25, 64 / 132, 1.0]), st.sampled_from([None, 0.5]),
       st.integers(1, 300))
def test_run_step_prices_are_the_elementwise_ones(b, per_seq, extra, f, bw_sat, n):
    """`decode_run_s` (consecutive steps priced as one run) gives `SmShareCost.decode_steps_s`'s
    floats."""
    hw = H100X4
    cost = GpuCostModel(get_model("qwen3-14b"), hw.gpu, 4, hw.nvlink)
    curves = hw.gpu.overheads.get("sm_share") if bw_sat is None else None
    c = SmShareCost(cost, bw_sat or 0.5, curves=curves)
    steps = np.arange(n, dtype=np.int64)
    s0, m0 = b * per_seq + extra, per_seq + extra + 1
    want = c.decode_steps_s(b, s0 + b * steps, f, m0 + steps)
    mux = MuxShareCost(cost, bw_sat or 0.5, curves=curves)
    assert mux.decode_run_s(b, s0, m0, n, f).tobytes() == want.tobytes()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 12000), min_size=1, max_size=4), st.integers(1, 300),
       st.integers(1, 40000), st.sampled_from([16 / 132, 24 / 132, 0.25, 64 / 132, 1.0]),
       st.sampled_from([None, 0.5]), st.sampled_from([1, 4]), st.integers(1, 20000))
def test_mux_share_cost_prices_are_smshare_ones(prompts, b, ctx, f, bw_sat, tp, table):
    """`MuxShareCost` (memoised share throughputs, tabulated linear ops, a table smaller or
    larger than the batch) gives `SmShareCost`'s prices, asked in any order."""
    hw = H100X4
    model = get_model("qwen3-14b")
    cost = GpuCostModel(model, hw.gpu, tp, hw.nvlink)
    curves = hw.gpu.overheads.get("sm_share") if bw_sat is None else None
    ref = SmShareCost(cost, bw_sat or 0.5, curves=curves)
    mux = MuxShareCost(cost, bw_sat or 0.5, curves=curves, table_tokens=table)
    p = np.asarray(prompts, dtype=np.int64)
    for _ in range(2):  # the second round from the memos
        for share in (f, 1.0 - f) if f < 1.0 else (f,):  # decode's share and prefill's
            assert mux.prefill_s(p, share) == ref.prefill_s(p, share)
        assert mux.decode_step_s(b, b * ctx, f, ctx + 7) == ref.decode_step_s(b, b * ctx, f, ctx + 7)
        for tokens in (b, int(p.sum()), table, table + 1):
            assert mux.dense_us(tokens, f) == ref.dense_us(tokens, f)
            assert mux.dense_us(tokens, f, False) == ref.dense_us(tokens, f, False)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 64), st.integers(1, 20000), st.integers(1, 70),
       st.sampled_from([5.0, 20.0, 100.0]))
def test_split_steps_are_chosen_as_one_step_at_a_time(b, per_seq, k, tbt_ms):
    """`_split_steps` (the first steps one at a time, then runs) picks each step's SMs and
    time as `_choose` does for that step alone."""
    from tests.helpers import workload
    w = workload(np.array([0.0]), np.array([100]), np.array([4]))
    _, (eng,) = _run(w, "qwen3-14b", tbt_ms=tbt_ms)
    s0, m0 = b * per_seq, per_seq + 3
    got = list(eng._split_steps(b, s0, m0, k))
    assert got == [eng._choose(b, s0 + b * j, m0 + j) for j in range(k)]
