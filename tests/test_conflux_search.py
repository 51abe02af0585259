"""ConfluxServe's water-level search from a hint (the engine passes the last levels found)
returns what the doubling-and-bisection search does, for any hint; and the engine's per-rank
decode-attention cache and chunked leap pricing leave an end-to-end run's token times as they
were (checked here against the uncached cost model)."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simserve.cost.sp as cs
from simserve.cost.sp import SpCostModel
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.policies.conflux.dispatch import (Candidate, RankState, _Search, decode_state,
                                                dispatch, dispatch_on, find_level)
from simserve.policies.conflux.estimator import ConfluxEstimator
from simserve.run import simulate_point
from tests.helpers import workload

H100X4 = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))

H100ISH = ConfluxEstimator(gamma=7.0e-7, gamma0=6e-5, a_d=2.5e-9, a_d0=1e-5, a_comm=3e-8,
                           a_comm0=2e-5, a_p=1.5e-11, a_p0=1e-5, num_layers=32)
rank_states = st.lists(st.builds(lambda n, c: RankState(n, n * c), st.integers(0, 200),
                                 st.integers(0, 16000)), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rank_states, st.data(), st.floats(0.002, 0.2), st.sampled_from([1, 16, 64]),
       st.one_of(st.none(), st.builds(Candidate, st.integers(1, 20000), st.integers(0, 30000))),
       st.integers(0, 1 << 16), st.sampled_from([1 << 10, 1 << 14, 1 << 20]))
def test_search_from_any_hint_finds_the_same_level(ranks, data, tau, q, cand, hint, top):
    n = len(ranks)
    ap = data.draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    prefills = [(sum(ap), 500)] if sum(ap) else []
    ref = find_level(tau, H100ISH, ranks, ap, prefills, cand, q, top)
    assert find_level(tau, H100ISH, ranks, ap, prefills, cand, q, top, hint=hint) == ref
    hints = {cand is not None: hint}
    assert dispatch(tau, H100ISH, ranks, ap, cand, q, prefills, top, hints=hints) == \
        dispatch(tau, H100ISH, ranks, ap, cand, q, prefills, top)
    assert hints[cand is not None] == ref


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=6), st.integers(0, 40000),
       st.sampled_from([1, 16, 64]), st.integers(1, 1 << 12))
def test_the_search_s_last_multiple_is_the_doubling_s(loads, m, q, top):
    """`_Search.last_multiple` in closed form is the first of 1, 2, 4, … (or top) whose level
    has room for the candidate, as the doubling finds it; `least_level` the lowest such."""
    s = _Search(0.1, H100ISH, [0] * len(loads), None, loads, 0.0, Candidate(m, 0))
    P = 1
    while not (P >= top or s.room(P * q) >= m):
        P = min(2 * P, top)
    assert s.last_multiple(top, q) == P
    low = s.least_level(m)
    assert s.room(low) >= m and (m == 0 or s.room(low - 1) < m)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rank_states, st.data(), st.floats(0.002, 0.2), st.sampled_from([1, 16, 64]),
       st.builds(Candidate, st.integers(1, 20000), st.integers(0, 30000)),
       st.integers(0, 1 << 16), st.sampled_from([1 << 10, 1 << 14, 1 << 20]))
def test_a_candidate_without_room_is_told_from_one_estimate(ranks, data, tau, q, cand, hint,
                                                            top):
    """`dispatch_on(..., only_if_room=True)`: the search's answer, its hints left alone when
    the candidate gets no token."""
    n = len(ranks)
    ap = data.draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    nd, t_d = decode_state(H100ISH, ranks)
    work = float(sum(ap)) * 700
    h1, h2 = {True: hint}, {True: hint}
    want = dispatch_on(tau, H100ISH, nd, t_d, ap, cand, q, work, top, h1)
    assert dispatch_on(tau, H100ISH, nd, t_d, ap, cand, q, work, top, h2,
                       only_if_room=True) == want
    assert h2 == (h1 if want[0] else {True: hint})


def test_cached_decode_attention_gives_the_cost_model_s_floats():
    cm = SpCostModel(get_model("qwen3-14b"), H100X4.gpu, H100X4.nvlink, 4)
    rng = np.random.default_rng(0)
    for _ in range(200):
        b = int(rng.integers(1, 64))
        m = int(rng.integers(1, 30000))
        c = b * m - int(rng.integers(0, b * (m - 1) + 1))
        r, lo, n = int(rng.integers(0, 4)), int(rng.integers(0, 300)), int(rng.integers(1, 200))
        got = cm.rank_attn(r, b, c + b * lo, m + lo, n)
        want = [float(cm.base.decode_attn(b, c + b * (lo + i), m + lo + i)) for i in range(n)]
        assert got.tolist() == want
        nd, c0, m0 = [b, 0, 3, 1], [c, 0, 3 * 100, 50], [m, 0, 120, 50]
        k = np.arange(lo, lo + n)[:, None]
        ref = cm.decode_only_s(nd, np.array(c0)[None, :] + np.array(nd)[None, :] * k,
                               np.array(m0)[None, :] + k)
        assert cm.decode_steps_s(nd, c0, m0, lo, n).tolist() == ref.tolist()


def test_conflux_run_is_unchanged_by_the_caches():
    rng = np.random.default_rng(5)
    n = 40
    w = workload(np.cumsum(rng.exponential(0.3, n)), rng.integers(500, 20000, n),
                 rng.integers(5, 300, n))
    hw = H100X4
    a = simulate_point(w, "qwen3-14b", hw, "conflux")
    saved = cs.DECODE_LOOKAHEAD
    try:                    # every step priced alone: the cache never holds a later step
        cs.DECODE_LOOKAHEAD = 1
        b = simulate_point(w, "qwen3-14b", hw, "conflux", leap=False)
    finally:
        cs.DECODE_LOOKAHEAD = saved
    assert np.array_equal(a.records.token_times_s, b.records.token_times_s)

