"""ConfluxServe's pure scheduling algorithms: estimator, waterfill dispatch, decode placement,
Moore–Hodgson admission and the per-iteration scheduler."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.errors import ConfigError
from simserve.policies.conflux.admission import (PendingPrefill, capacity_before, fcfs,
                                                 moore_hodgson, schedule_iteration)
from simserve.policies.conflux.dispatch import (Candidate, RankState, dispatch, find_level,
                                                waterfill)
from simserve.policies.conflux.estimator import (ConfluxEstimator, fit_estimator,
                                                 samples_from_functions)
from simserve.policies.conflux.placement import place_decode

EST = ConfluxEstimator(gamma=1e-3, gamma0=0.5, a_d=1e-4, a_d0=0.2, a_comm=2e-3, a_comm0=0.1,
                       a_p=1e-5, a_p0=0.3, alpha=1.5, beta=1.2, num_layers=2)
# roughly an 8B model on one H100 per rank (seconds per layer), for dispatch scenarios
H100ISH = ConfluxEstimator(gamma=7.0e-7, gamma0=6e-5, a_d=2.5e-9, a_d0=1e-5, a_comm=3e-8,
                           a_comm0=2e-5, a_p=1.5e-11, a_p0=1e-5, num_layers=32)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- estimator ------------------------------------------------------------------------------
def test_estimator_hand_computed_two_ranks():
    # T_GEMM = 1e-3·110 + 0.5 = 0.61; T_D = max(0.3, 0.7) = 0.7 → α·T_D = 1.05
    # T_P = (2e-3·100 + 0.1) + (1e-5·150·(200 + 75.5)/2 + 0.3) = 0.806625 → β·T_P = 0.96795
    assert EST.iteration_time([100, 50], [10, 30], [1000, 5000], [(150, 200)]) == \
        pytest.approx(2 * (0.61 + 1.05))
    # no decodes: the decode path drops out, the prefill path decides at its own time (no
    # contention without a second path); Eq. 2 to the letter keeps β
    assert EST.iteration_time([100, 50], [0, 0], [0, 0], [(150, 200)]) == \
        pytest.approx(2 * (0.6 + 0.806625))
    literal = dataclasses.replace(EST, literal=True)
    assert literal.iteration_time([100, 50], [0, 0], [0, 0], [(150, 200)]) == \
        pytest.approx(2 * (0.6 + 0.96795))
    # no prefill: the prefill path drops out
    assert EST.iteration_time([0, 0], [10, 30], [1000, 5000], []) == pytest.approx(2 * (0.53 + 0.7))
    assert literal.iteration_time([0, 0], [10, 30], [1000, 5000], []) == \
        pytest.approx(2 * (0.53 + 1.05))
    assert EST.iteration_time([0, 0], [0, 0], [0, 0], []) == 0.0
    # both paths, contention larger than overlap saves: capped at running them back to back
    heavy = dataclasses.replace(EST, alpha=3.0)
    assert heavy.iteration_time([100, 50], [10, 30], [1000, 5000], [(150, 200)]) == \
        pytest.approx(2 * (0.61 + 0.806625 + 0.7))


@FAST
@given(st.integers(1, 4).flatmap(lambda n: st.tuples(
    *[st.lists(st.integers(0, 500), min_size=n, max_size=n) for _ in range(3)],
    st.lists(st.tuples(st.integers(0, 300), st.integers(0, 5000)), max_size=3),
    st.integers(0, n - 1), st.integers(0, 3), st.integers(1, 200))))
def test_estimator_monotone(args):
    n_p, n_d, ctx, prefills, r, which, bump = args
    base = EST.iteration_time(n_p, n_d, ctx, prefills)
    vals = [list(n_p), list(n_d), list(ctx)]
    if which < 3:
        vals[which][r] += bump
        assert EST.iteration_time(*vals, prefills) >= base
    elif prefills:
        grown = [(ell + bump, c) for ell, c in prefills]
        assert EST.iteration_time(n_p, n_d, ctx, grown) >= base


def test_estimator_rejects_negative_coefficient():
    with pytest.raises(ConfigError, match="a_comm"):
        ConfluxEstimator(1, 0, 1, 0, -1, 0, 1, 0)


def test_fit_estimator_recovers_affine_functions():
    truth = {"gemm": (2e-7, 6e-5), "decode_attn": (2.5e-9, 1e-5), "prefill_attn": (1.5e-11, 1e-5),
             "comm": (3e-8, 2e-5)}
    fns = {k: (lambda x, a=a, b=b: a * x + b) for k, (a, b) in truth.items()}
    grids = {"gemm": np.arange(1, 8192, 64), "decode_attn": np.linspace(0, 1e6, 30),
             "prefill_attn": np.linspace(1e3, 1e9, 30), "comm": np.arange(16, 4096, 64)}
    est = fit_estimator(samples_from_functions(fns, grids), num_layers=32, alpha=1.1)
    got = {"gemm": (est.gamma, est.gamma0), "decode_attn": (est.a_d, est.a_d0),
           "prefill_attn": (est.a_p, est.a_p0), "comm": (est.a_comm, est.a_comm0)}
    for k in truth:
        assert got[k] == pytest.approx(truth[k], rel=1e-6)
    assert (est.alpha, est.beta, est.num_layers) == (1.1, 1.0, 32)
    with pytest.raises(ConfigError, match="comm"):
        fit_estimator({k: v for k, v in samples_from_functions(fns, grids).items() if k != "comm"})


# -- dispatch -------------------------------------------------------------------------------
def test_waterfill_fills_lowest_first_and_respects_level():
    assert waterfill(1024, [128, 0, 0, 0], 512) == (160, 288, 288, 288)
    assert waterfill(5, [3, 0, 1], 10) == (0, 3, 2)
    assert waterfill(3, [5, 5, 5], 6) == (1, 1, 1)
    with pytest.raises(ValueError):
        waterfill(4, [5, 5, 5], 6)


def test_dispatch_fig15a_decode_heavy_rank_gets_fewer_tokens():
    ranks = [RankState(128, 128 * 2048)] + [RankState()] * 3
    ell, a = dispatch(0.1, H100ISH, ranks, candidate=Candidate(1024, 0))
    assert ell == 1024 and sum(a) == 1024
    assert a[0] < min(a[1:]) and sum(a[1:]) >= 0.8 * 1024
    # shared-linear bottleneck: even split 128 + 256 = 384 tokens vs waterfill 288 (≈1.33×)
    assert max(x + r.num_decodes for x, r in zip(a, ranks)) == 288


rank_states = st.lists(st.builds(lambda n, c: RankState(n, n * c), st.integers(0, 200),
                                 st.integers(0, 16000)), min_size=1, max_size=6)


@FAST
@given(rank_states, st.data(), st.floats(0.005, 0.2), st.sampled_from([1, 16, 64]),
       st.one_of(st.none(), st.builds(Candidate, st.integers(1, 20000), st.integers(0, 30000))))
def test_dispatch_never_exceeds_tau_and_budget_is_maximal(ranks, data, tau, q, cand):
    n = len(ranks)
    ap = data.draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    prefills = [(sum(ap), 500)] if sum(ap) else []
    nd = [r.num_decodes for r in ranks]
    ctx = [r.decode_ctx_tokens for r in ranks]
    loads = [a + d for a, d in zip(ap, nd)]
    level = find_level(tau, H100ISH, ranks, ap, prefills, cand, q)
    assert level % q == 0
    out = dispatch(tau, H100ISH, ranks, ap, cand, q, prefills)
    budget = sum(max(0, level - x) for x in loads)

    def filled(lvl):  # the state at a given level, built independently of dispatch
        room = sum(max(0, lvl - x) for x in loads)
        if cand is None:
            extra, pf = [max(0, lvl - x) for x in loads], prefills
        else:
            chunk = min(cand.remaining_tokens, room)
            extra = waterfill(chunk, loads, lvl)
            pf = prefills + ([(chunk, cand.context_tokens)] if chunk else [])
        return H100ISH.iteration_time([a + e for a, e in zip(ap, extra)], nd, ctx, pf), room

    if cand is None:
        assert out == budget
        if budget:
            assert filled(level)[0] <= tau
    else:
        ell, a = out
        assert ell == min(cand.remaining_tokens, budget) and sum(a) == ell
        assert all(x == 0 or x + ld <= level for x, ld in zip(a, loads))
        if ell:
            t = H100ISH.iteration_time([p + x for p, x in zip(ap, a)], nd, ctx,
                                       prefills + [(ell, cand.context_tokens)])
            assert t <= tau
    # maximal: one more quantum breaks τ, unless the candidate already gets all it asked for
    if cand is None or budget < cand.remaining_tokens:
        t_next, room_next = filled(level + q)
        if room_next > budget or level == 0:
            assert t_next > tau


def test_dispatch_zero_when_decodes_alone_break_tau():
    ranks = [RankState(64, 64 * 100000), RankState()]
    assert dispatch(0.01, H100ISH, ranks) == 0
    assert dispatch(0.01, H100ISH, ranks, candidate=Candidate(100)) == (0, (0, 0))


# -- placement ------------------------------------------------------------------------------
def test_placement_worst_fit_below_eta():
    ranks = [RankState(4, 40000, 500, 1000), RankState(2, 20000, 300, 1000),
             RankState(8, 90000, 900, 1000)]
    assert place_decode(10, ranks, eta=0.8, headroom=0.0) == 1


def test_placement_best_fit_above_eta():
    ranks = [RankState(4, 40000, 850, 1000), RankState(2, 20000, 820, 1000),
             RankState(8, 90000, 950, 1000)]
    assert place_decode(10, ranks, eta=0.8, headroom=0.0) == 2   # tightest that fits
    assert place_decode(60, ranks, eta=0.8, headroom=0.0) == 0   # rank 2 cannot hold 60


def test_placement_headroom_and_infeasible():
    ranks = [RankState(1, 100, 880, 1000), RankState(1, 50, 700, 1000)]
    assert place_decode(100, ranks, eta=0.5, headroom=0.0) == 0        # best fit: 980 ≤ 1000
    assert place_decode(100, ranks, eta=0.5, headroom=0.05) == 1       # 980 > 950 breaks h
    assert place_decode(300, ranks, eta=0.5, headroom=0.05) is None
    with pytest.raises(ConfigError, match="eta"):
        place_decode(1, ranks, eta=1.5)


# -- admission ------------------------------------------------------------------------------
def _feasible(jobs, b0, tau):
    total = 0
    for p in sorted(jobs, key=lambda p: (p.deadline_s, p.arrival_s, p.req_id)):
        total += p.remaining_tokens
        if total > capacity_before(p.deadline_s, 0.0, tau, b0):
            return False
    return True


jobs_st = st.lists(st.tuples(st.integers(1, 60), st.integers(0, 12)), min_size=0, max_size=8)


@settings(max_examples=150, deadline=None)
@given(jobs_st, st.integers(0, 40))
def test_moore_hodgson_admits_maximum_on_time_set(jobs, b0):
    tau = 0.1
    pending = [PendingPrefill(i, 0.0, k * tau, m) for i, (m, k) in enumerate(jobs)]
    admitted, rejected = moore_hodgson(pending, b0, 0.0, tau)
    assert sorted(p.req_id for p in admitted + rejected) == list(range(len(jobs)))
    assert _feasible(admitted, b0, tau)
    best = max(r for r in range(len(jobs) + 1)
               if any(_feasible(s, b0, tau) for s in itertools.combinations(pending, r)))
    assert len(admitted) == best
    assert [p.deadline_s for p in admitted] == sorted(p.deadline_s for p in admitted)
    assert [p.remaining_tokens for p in rejected] == sorted(p.remaining_tokens for p in rejected)


def test_moore_hodgson_drops_longest_and_orders():
    pend = [PendingPrefill(0, 0.0, 0.35, 50), PendingPrefill(1, 0.1, 0.25, 200),
            PendingPrefill(2, 0.2, 0.45, 30), PendingPrefill(3, 0.05, 0.3, 300)]
    # K: 2·100 for d=0.25, 3·100 for 0.3 and 0.35, 4·100 for 0.45
    adm, rej = moore_hodgson(pend, 100, 0.0, 0.1)
    assert [p.req_id for p in adm] == [1, 0, 2] and [p.req_id for p in rej] == [3]
    adm, rej = fcfs(pend)
    assert [p.req_id for p in adm] == [0, 3, 1, 2] and rej == []


# -- the per-iteration scheduler -----------------------------------------------------------
def test_schedule_iteration_fills_budget_and_places_finishers():
    ranks = [RankState(32, 32 * 4000, 4000, 20000), RankState(0, 0, 0, 20000),
             RankState(16, 16 * 4000, 2000, 20000), RankState(0, 0, 500, 20000)]
    pend = [PendingPrefill(0, 0.0, 1.0, 600), PendingPrefill(1, 0.0, 0.5, 100000, 2000),
            PendingPrefill(2, 0.0, 2.0, 300)]
    plan = schedule_iteration(pend, ranks, H100ISH, 0.05, 0.0)
    assert plan.b0 > 0 and plan.admitted[0] == 0
    t = H100ISH.iteration_time(list(plan.rank_prefill_tokens), [r.num_decodes for r in ranks],
                               [r.decode_ctx_tokens for r in ranks],
                               [(c.tokens, c.context_tokens) for c in plan.chunks])
    assert t <= 0.05
    finished = [c.req_id for c in plan.chunks if c.finishes]
    assert [r for r, _ in plan.decode_placements] == finished
    # worst-fit spreads the two short finishers over the empty ranks
    assert {g for _, g in plan.decode_placements} <= {1, 3}
    assert sum(plan.rank_prefill_tokens) == sum(c.tokens for c in plan.chunks)


def test_schedule_iteration_stops_when_no_decode_rank_fits():
    ranks = [RankState(0, 0, 99, 100), RankState(0, 0, 99, 100)]
    pend = [PendingPrefill(0, 0.0, 1.0, 200), PendingPrefill(1, 0.0, 2.0, 50)]
    plan = schedule_iteration(pend, ranks, H100ISH, 0.05, 0.0, headroom=0.0)
    assert plan.chunks == () and plan.decode_placements == ()
    plan = schedule_iteration(pend, ranks, H100ISH, 0.05, 0.0, admission="fcfs", headroom=0.0)
    assert plan.chunks == ()
    with pytest.raises(ConfigError, match="admission"):
        schedule_iteration(pend, ranks, H100ISH, 0.05, 0.0, admission="srpt")
