"""ConfluxServe's instance with a few decodes: their counts read one by one (plain ints) give
the arrays' answers, one leap call runs on through finishes before the next arrival, and a
prefilling iteration is priced by `mixed_step_s` as `iteration_s` prices it."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simserve.cost.sp import SpCostModel
from simserve.models import get_model
from simserve.policies.conflux import engine as conflux_engine
from simserve.policies.conflux import leap as conflux_leap
from simserve.policies.sp_ranks import SpRanksEngine
from tests.helpers import CONFLUX_PREEMPTING, H100X4, conflux_scenarios, run_conflux, workload

QWEN14 = get_model("qwen3-14b")




@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conflux_scenarios())
@example(CONFLUX_PREEMPTING)
def test_few_decodes_in_plain_ints_match_the_array_path(sc):
    """FEW_DECODES = 0 sends every decode state and leap through numpy's gathers (and the
    samples through `SpRanksEngine._sample`): the same token times, preemptions, iterations,
    pools and samples."""
    w, params = sc
    fast = run_conflux(w, **params)
    Xp = conflux_engine.XpInstance
    saved = conflux_engine.FEW_DECODES, conflux_leap.FEW_DECODES, Xp._sample
    try:
        conflux_engine.FEW_DECODES = conflux_leap.FEW_DECODES = 0
        Xp._sample = SpRanksEngine._sample      # Σ num_used of the pools
        slow = run_conflux(w, **params)
    finally:
        conflux_engine.FEW_DECODES, conflux_leap.FEW_DECODES, Xp._sample = saved
    assert np.array_equal(fast.records.token_times_s, slow.records.token_times_s)
    assert np.array_equal(fast.records.num_preemptions, slow.records.num_preemptions)
    assert fast.stats["num_iterations"] == slow.stats["num_iterations"]
    assert fast.stats["peak_kv_blocks"] == slow.stats["peak_kv_blocks"]
    assert fast.stats["conflux"] == slow.stats["conflux"]
    for name in ("t", "num_running", "num_waiting", "kv_used_blocks", "tokens_total"):
        assert list(getattr(fast.recorder, name)) == list(getattr(slow.recorder, name))


def test_one_leap_runs_through_finishes_before_the_next_arrival(monkeypatch):
    """Three requests decode together and finish at different steps with nothing arriving
    after them: after the prefills, a single leap call takes every remaining step, one
    segment (and sample) per finish, as separate leaps would."""
    calls, segments = [], []
    leap, once = conflux_engine.XpInstance._leap, conflux_leap._leap_once

    def counted_leap(self):
        calls.append(self.clock)
        return leap(self)

    def counted_once(eng, cap):
        k = once(eng, cap)
        segments.append(k)
        return k

    w = workload([0.0, 0.0, 0.0], [64, 64, 64], [40, 90, 150])
    want = run_conflux(w)
    monkeypatch.setattr(conflux_engine.XpInstance, "_leap", counted_leap)
    monkeypatch.setattr(conflux_leap, "_leap_once", counted_once)
    got = run_conflux(w)
    assert np.array_equal(got.records.token_times_s, want.records.token_times_s)
    assert len(calls) == 1
    assert [k for k in segments if k] == [39, 50, 60]   # up to each finish, then the last


@st.composite
def mixed_iterations(draw):
    """A prefilling iteration on 4 ranks: chunks split over the ranks, decodes per rank with
    Σ context and longest context, sampled rows; and which ranks have a cached decode line."""
    chunks = draw(st.lists(st.integers(1, 9000), min_size=1, max_size=4))
    ctxs = [draw(st.integers(0, 20000)) for _ in chunks]
    total = sum(chunks)
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=3, max_size=3)))
    n_p = [b - a for a, b in zip([0] + cuts, cuts + [total])]
    n_d, dctx, dmax = [], [], []
    for _ in range(4):
        k = draw(st.integers(0, 40))
        m = draw(st.integers(1, 30000)) if k else 0
        n_d.append(k)
        dmax.append(m)
        dctx.append(draw(st.integers(k, k * m)) if k else 0)
    rows = max(n_d) + draw(st.integers(0, len(chunks)))
    lines = draw(st.lists(st.booleans(), min_size=4, max_size=4))
    return n_p, n_d, dctx, chunks, ctxs, rows, dmax, lines


@settings(max_examples=200, deadline=None)
@given(mixed_iterations())
def test_mixed_step_is_iteration_s(it):
    """`SpCostModel.mixed_step_s` (the engine's prefilling iterations) gives `iteration_s`'s
    float, decode attention read from cached lines or priced alone."""
    n_p, n_d, dctx, chunks, ctxs, rows, dmax, lines = it
    cost = SpCostModel(QWEN14, H100X4.gpu, H100X4.nvlink, 4)
    for r, (k, c, m, cached) in enumerate(zip(n_d, dctx, dmax, lines)):
        if k and cached:   # a line from a few steps back that holds this step
            if m > 3 and c - 3 * k >= k:
                cost.rank_attn(r, k, c - 3 * k, m - 3, 8)
    want = cost.iteration_s(n_p, n_d, dctx, np.array(chunks), np.array(ctxs), rows, dmax)
    assert cost.mixed_step_s(n_p, n_d, dctx, chunks, ctxs, rows, dmax) == want


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1 << 40))
def test_fitted_alltoall_of_one_size_is_the_array_call(nbytes):
    """4 ranks have no measured all-to-all table: the fitted line prices one size (an int)
    in plain floats, as its array call prices it."""
    cost = SpCostModel(QWEN14, H100X4.gpu, H100X4.nvlink, 4)
    a2a = cost._a2a
    assert a2a(nbytes) == float(a2a(np.array([nbytes]))[0]) == float(a2a(float(nbytes)))
