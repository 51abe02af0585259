"""ConfluxServe's fast paths give the slow paths' answers: `SpCostModel`'s rank lines and one-step
pricing,
the dispatch search (one waterfill past saturation, the decode state shared by an iteration's
dispatches), the plan (no admission order for a lone prompt, B0 only where Moore–Hodgson needs
it), the engine's decode state and decode-only pricing, and the instance's leap."""
from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simserve.cost.sp import SpCostModel
from simserve.models import get_model
from simserve.policies.conflux import engine as conflux_engine
from simserve.policies.conflux.admission import ADMISSION, PendingPrefill
from simserve.policies.conflux.dispatch import (Candidate, RankState, dispatch, find_level,
                                                waterfill)
from simserve.policies.conflux.estimator import ConfluxEstimator
from simserve.policies.conflux.placement import place_decode
from simserve.policies.conflux.plan import plan_prefills
from simserve.policies.sp_ranks import SpRanksEngine, blocks_for, shard_blocks
from tests.helpers import CONFLUX_PREEMPTING, H100X4, conflux_scenarios, run_conflux

QWEN14 = get_model("qwen3-14b")
EST = ConfluxEstimator(gamma=7.0e-7, gamma0=6e-5, a_d=2.5e-9, a_d0=1e-5, a_comm=3e-8,
                       a_comm0=2e-5, a_p=1.5e-11, a_p0=1e-5, alpha=1.2, beta=1.4, num_layers=32)
SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the cost model ---------------------------------------------------------------------------
class GeneralPath(SpCostModel):
    """`SpCostModel` with its fast paths off: decode attention through the base model's general
    array call (as when a hook replaces it), every line built and read."""

    def _profile_fn(self):
        return None


def test_sp_cost_model_fast_paths_price_as_the_general_path():
    """Rank lines by `decode_steps_us`, one step read from a line or priced alone
    (`rank_attn1`, `decode_step_s`), the in-place forward of `decode_steps_s`: the floats of
    the general array path."""
    fast, slow = SpCostModel(QWEN14, H100X4.gpu, H100X4.nvlink, 4), \
        GeneralPath(QWEN14, H100X4.gpu, H100X4.nvlink, 4)
    rng = np.random.default_rng(1)
    for _ in range(150):
        b = int(rng.integers(1, 80))
        m = int(rng.integers(1, 40000))
        c = b * m - int(rng.integers(0, b * (m - 1) + 1))   # some contexts shorter than m
        r, lo, n = int(rng.integers(0, 4)), int(rng.integers(0, 600)), int(rng.integers(1, 300))
        line = slow.rank_attn(r, b, c + b * lo, m + lo, n).tolist()
        j = np.arange(m + lo, m + lo + n, dtype=np.int64)
        assert line == slow._attn_general(b, c + b * (j - m), j).tolist()
        fast._lines.clear()
        assert fast.rank_attn1(r, b, c + b * lo, m + lo) == line[0]       # alone
        assert fast.rank_attn(r, b, c + b * lo, m + lo, n).tolist() == line
        assert fast.rank_attn1(r, b, c + b * (lo + n - 1), m + lo + n - 1) == line[-1]  # cached
        nd = [b, 0, int(rng.integers(1, 9)), 1]
        c0 = [c, 0, nd[2] * 700, 90]
        m0 = [m, 0, 900, 90]
        steps = slow.decode_steps_s(nd, c0, m0, lo, n).tolist()
        assert fast.decode_steps_s(nd, c0, m0, lo, n).tolist() == steps
        at = [x + k * lo for x, k in zip(c0, nd)], [x + lo if x else 0 for x in m0]
        fast._lines.clear()
        assert fast.decode_step_s(nd, *at) == steps[0]
        assert fast.decode_steps_s(nd, *at, 0, 1).tolist() == [steps[0]]
        z = np.zeros(0, np.int64)
        assert fast.iteration_s([0] * 4, nd, *at[:1], z, z, max(nd), at[1]) == steps[0]
        ell = np.array([int(rng.integers(1, 9000))])
        ctx = np.array([int(rng.integers(0, 9000))])
        n_p = list(waterfill(int(ell[0]), nd, max(nd) + int(ell[0])))
        assert fast.iteration_s(n_p, nd, c0, ell, ctx, max(nd) + 1, m0) == \
            slow.iteration_s(n_p, nd, c0, ell, ctx, max(nd) + 1, m0)


@SOME
@given(st.integers(-1, 5000), st.integers(-1, 3000), st.floats(0, 1e9), st.integers(1, 8),
       st.one_of(st.none(), st.floats(0, 1e-3)), st.booleans(), st.booleans(),
       st.sampled_from([1.0, 1.2, 1.4]), st.sampled_from([1.0, 1.2, 1.4]))
def test_estimator_combine_is_its_pieces(tokens, max_p, work, ranks, t_d, overlap, literal,
                                         alpha, beta):
    """`combine`'s inlined common case is `prefill_path` and `split` as written."""
    est = dataclasses.replace(EST, overlap=overlap, literal=literal, alpha=alpha, beta=beta)
    want = 0.0 if tokens <= 0 else est.num_layers * (
        est.gamma * tokens + est.gamma0 + est.split(est.prefill_path(max_p, work, ranks), t_d))
    assert est.combine(tokens, max_p, work, ranks, t_d) == want
    if t_d is not None and max_p > 0 and tokens > 0:   # the two paths tie
        t_p = est.prefill_path(max_p, work, ranks)
        assert est.combine(tokens, max_p, work, ranks, t_p * beta / alpha) == \
            est.num_layers * (est.gamma * tokens + est.gamma0
                              + est.split(t_p, t_p * beta / alpha))


# -- dispatch -------------------------------------------------------------------------------
loads_st = st.lists(st.integers(0, 400), min_size=1, max_size=6)


@SOME
@given(loads_st, st.integers(0, 3000), st.integers(0, 600))
def test_waterfill_is_the_same_below_every_level_with_room(loads, m, extra):
    """What `_Search.past` relies on: m tokens split the same below any level with room for
    them, and filling all of a level's room is every rank raised to it."""
    def room(level):
        return sum(max(0, level - x) for x in loads)

    lowest = next(L for L in range(max(loads) + m + 2) if room(L) >= m)
    first = waterfill(m, loads, lowest)
    for level in (lowest, lowest + 1, lowest + extra):
        assert waterfill(m, loads, level) == first
    assert waterfill(room(lowest), loads, lowest) == tuple(max(0, lowest - x) for x in loads)


def _reference_level(tau, est, ranks, ap, prefills, cand, q, top):
    """The highest safe multiple of q up to P, every level priced by `iteration_time` on its
    waterfilled state (P: the first of 1, 2, 4, … that saturates the candidate, or top)."""
    nd = [r.num_decodes for r in ranks]
    ctx = [r.decode_ctx_tokens for r in ranks]
    dmax = [r.decode_max_ctx for r in ranks]
    loads = [a + d for a, d in zip(ap, nd)]

    def room(level):
        return sum(max(0, level - x) for x in loads)

    P = 1
    while not (P >= top or (cand is not None and room(P * q) >= cand.remaining_tokens)):
        P = min(2 * P, top)
    best = 0
    for k in range(1, P + 1):
        level = k * q
        if cand is None:
            extra, pf = [max(0, level - x) for x in loads], list(prefills)
        else:
            chunk = min(cand.remaining_tokens, room(level))
            extra = waterfill(chunk, loads, level)
            pf = list(prefills) + ([(chunk, cand.context_tokens)] if chunk else [])
        n_p = [a + e for a, e in zip(ap, extra)]
        if est.iteration_time(n_p, nd, ctx, pf, dmax) <= tau:
            best = level
    return best


@SOME
@given(st.lists(st.builds(lambda n, c: RankState(n, n * c, decode_max_ctx=c + n),
                          st.integers(0, 120), st.integers(0, 12000)), min_size=1, max_size=5),
       st.data(), st.floats(0.004, 0.15), st.sampled_from([16, 64]),
       st.one_of(st.none(), st.builds(Candidate, st.integers(1, 12000), st.integers(0, 20000))),
       st.integers(0, 1 << 12), st.booleans())
def test_dispatch_finds_the_directly_searched_level(ranks, data, tau, q, cand, hint, literal):
    est = dataclasses.replace(EST, literal=literal)
    n, top = len(ranks), (1 << 11) // q
    ap = data.draw(st.lists(st.integers(0, 200), min_size=n, max_size=n))
    prefills = [(sum(ap), 300)] if sum(ap) else []
    ref = _reference_level(tau, est, ranks, ap, prefills, cand, q, top)
    assert find_level(tau, est, ranks, ap, prefills, cand, q, 1 << 11) == ref
    hints = {cand is not None: hint}
    out = dispatch(tau, est, ranks, ap, cand, q, prefills, 1 << 11, hints=hints)
    assert hints[cand is not None] == ref
    loads = [a + r.num_decodes for a, r in zip(ap, ranks)]
    budget = sum(max(0, ref - x) for x in loads)
    if cand is None:
        assert out == budget
    else:
        ell = min(cand.remaining_tokens, budget)
        assert out == (ell, waterfill(ell, loads, ref))


# -- the plan -------------------------------------------------------------------------------
def _reference_plan(pending, needs, held, ranks, free, est, tau, now, admission, q, eta,
                    headroom, bs, max_level):
    """Alg. 1 as `plan_prefills` was first written: B0 always searched, the admission order
    always taken, every dispatch from the rank states and the chunk list."""
    R = len(ranks)
    ap = [0] * R
    b0 = dispatch(tau, est, ranks, ap, None, q, max_level=max_level)
    admitted, rejected = ADMISSION[admission](pending, b0, now, tau)
    index = {p.req_id: k for k, p in enumerate(pending)}
    free, tentative, prefills, out = list(free), list(ranks), [], []
    for p in admitted + rejected:
        ell, per = dispatch(tau, est, ranks, ap, Candidate(p.remaining_tokens, p.context_tokens),
                            q, prefills, max_level=max_level)
        if ell == 0:
            break
        k = index[p.req_id]
        total = p.context_tokens + ell
        new = max(0, shard_blocks(total, bs, R) - held[k])
        if any(f < new for f in free):
            break
        g, dest = -1, 0
        if ell == p.remaining_tokens and needs[k]:
            full = blocks_for(total, bs)
            dest = max(0, full - held[k] - new)
            g = place_decode(full - held[k], tentative, eta, headroom)
            if g is None or free[g] < new + dest:
                break
            s = tentative[g]
            tentative[g] = dataclasses.replace(
                s, num_decodes=s.num_decodes + 1, decode_ctx_tokens=s.decode_ctx_tokens + total,
                decode_max_ctx=max(s.decode_max_ctx, total), kv_used_blocks=s.kv_used_blocks + dest)
            free[g] -= dest
        free = [f - new for f in free]
        ap = [a + x for a, x in zip(ap, per)]
        prefills.append((ell, p.context_tokens))
        out.append((p.req_id, ell, p.context_tokens, tuple(per), g, new, dest))
    return out


@SOME
@given(st.lists(st.tuples(st.integers(1, 20000), st.integers(0, 9000), st.floats(0.0, 3.0),
                          st.booleans()), min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8000), st.integers(0, 4000)),
                min_size=4, max_size=4),
       st.sampled_from(["moore_hodgson", "fcfs"]), st.floats(0.03, 0.3), st.integers(0, 2))
def test_plan_is_alg_1_as_first_written(pend, ranks, admission, tau, reps):
    pending = [PendingPrefill(i, a, a + 2.0, m, c) for i, (m, c, a, _) in enumerate(pend)]
    needs = [nd for _, _, _, nd in pend]
    held = [shard_blocks(c, 16, 4) for _, c, _, _ in pend]  # the shard of the prefilled part
    states = [RankState(n, n * c + n, u, 6000, c + 1 if n else 0) for n, c, u in ranks]
    free = [6000 - u for _, _, u in ranks]
    kw = dict(admission=admission, quantum=16, eta=0.8, headroom=0.05, block_size=16,
              max_level=8192)
    want = _reference_plan(pending, needs, held, states, free, EST, tau, 1.0, admission, 16,
                           0.8, 0.05, 16, 8192)
    hints: dict = {}
    for _ in range(reps + 1):  # the hints the engine keeps change nothing
        _, got = plan_prefills(pending, needs, held, states, free, EST, tau, 1.0, hints=hints,
                               **kw)
        assert [(c.req_id, c.tokens, c.context, c.per_rank, c.decode_rank, c.shard_new,
                 c.dest_blocks) for c in got] == want


@SOME
@given(st.lists(st.tuples(st.integers(1, 20000), st.integers(0, 9000), st.floats(0.0, 3.0),
                          st.booleans()), min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8000), st.integers(0, 4000)),
                min_size=4, max_size=4),
       st.sampled_from(["moore_hodgson", "fcfs"]), st.floats(0.03, 0.3), st.booleans(),
       st.booleans())
def test_the_plan_reports_the_estimate_of_its_iteration(pend, ranks, admission, tau, literal,
                                                        overlap):
    """What the engine's tracker records: the plan's own estimate is `iteration_time` of the
    chunks it returns (the searches' memo, not a second estimate)."""
    est = dataclasses.replace(EST, literal=literal, overlap=overlap)
    pending = [PendingPrefill(i, a, a + 2.0, m, c) for i, (m, c, a, _) in enumerate(pend)]
    needs = [nd for _, _, _, nd in pend]
    held = [shard_blocks(c, 16, 4) for _, c, _, _ in pend]
    states = [RankState(n, n * c + n, u, 6000, c + 1 if n else 0) for n, c, u in ranks]
    free = [6000 - u for _, _, u in ranks]
    report: dict = {}
    _, got = plan_prefills(pending, needs, held, states, free, est, tau, 1.0,
                           admission=admission, quantum=16, eta=0.8, headroom=0.05,
                           block_size=16, max_level=8192, hints={}, report=report)
    if not got:   # no estimate without chunks (admission's drop counts may be there)
        assert "estimate" not in report
        return
    n_p = [sum(c.per_rank[r] for c in got) for r in range(4)]
    assert report["estimate"] == est.iteration_time(
        n_p, [s.num_decodes for s in states], [s.decode_ctx_tokens for s in states],
        [(c.tokens, c.context) for c in got], [s.decode_max_ctx for s in states])


# -- the engine -----------------------------------------------------------------------------
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conflux_scenarios())
@example(CONFLUX_PREEMPTING)
def test_instance_leap_and_decode_state_match_the_shared_paths(sc):
    """The instance's leap takes `sp_leap.leap_ranks`' steps (token times, samples, pools);
    its decode state is `_rank_states()` / `_rank_max()`; a decode-only iteration costs what
    `iteration_s` says."""
    w, params = sc
    fast = run_conflux(w, **params)
    real_state, real_iter = conflux_engine.XpInstance._decode_state, \
        conflux_engine.XpInstance._iteration

    def state(self):
        nd, dctx, rmax = real_state(self)
        assert (list(nd), dctx) == tuple(self._rank_states()) and rmax == self._rank_max()
        return nd, dctx, rmax

    def iteration(self):
        step = real_iter(self)
        if step is not None and not any(self.last_prefill_per_rank):
            nd, dctx = self._rank_states()
            want = self.cost.iteration_s([0] * self.R, nd, dctx, np.zeros(0, np.int64),
                                         np.zeros(0, np.int64), max(nd), self._rank_max())
            assert step[0] == want
        return step

    saved = (conflux_engine.XpInstance._leap, conflux_engine.XpInstance._decode_state,
             conflux_engine.XpInstance._iteration)
    try:
        conflux_engine.XpInstance._leap = SpRanksEngine._leap   # sp_leap.leap_ranks(self)
        conflux_engine.XpInstance._decode_state = state
        conflux_engine.XpInstance._iteration = iteration
        slow = run_conflux(w, **params)
    finally:
        (conflux_engine.XpInstance._leap, conflux_engine.XpInstance._decode_state,
         conflux_engine.XpInstance._iteration) = saved
    assert np.array_equal(fast.records.token_times_s, slow.records.token_times_s)
    assert fast.stats["num_iterations"] == slow.stats["num_iterations"]
    assert fast.stats["peak_kv_blocks"] == slow.stats["peak_kv_blocks"]
    for name in ("t", "num_running", "num_waiting", "kv_used_blocks", "tokens_total"):
        assert list(getattr(fast.recorder, name)) == list(getattr(slow.recorder, name))
