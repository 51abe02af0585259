"""The vLLM engine's commit path (a leap's tokens, KV and finishes applied) takes fast paths
that must leave the very state of the general ones."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.policies.vllm_leap import new_blocks, new_blocks_upto
from simserve.run import simulate_point
from simserve.sim.kv import PrefixCachingBlockPool
from tests.helpers import H100, H200, requests


def _pool_state(p: PrefixCachingBlockPool) -> tuple:
    return (list(p._q.items()), dict(p.priv), dict(p.ref), p.num_free, p.peak_used, p.epoch,
            p._run, p.num_evictions)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["shared", "private", "anon", "take"]),
                          st.integers(1, 4)), max_size=12),
       st.integers(0, 12), st.integers(0, 5), st.integers(0, 5), st.booleans())
def test_release_unshared_is_free_then_release_private(ops, rid, anon, n, tail_private):
    # any free queue (anonymous runs, shared blocks, private runs, some evicted), then a
    # request frees its anonymous tail and its private run
    p = PrefixCachingBlockPool("t", 64)
    p.allocate(64)
    nxt = 100
    for i, (kind, m) in enumerate(ops):
        if kind == "anon":
            p.free(m)
        elif kind == "shared":
            nxt += 1
            p.register(nxt)
            p.release([nxt])
        elif kind == "private":
            p.release_private(i, 0, m)
        else:
            p.allocate(min(m, p.num_free))
    if tail_private and p.num_free + 2 <= 64:  # the queue's last entry is rid's own run
        p.release_private(rid, 0, 2)
    anon, n = min(anon, 64 - p.num_free), min(n, max(0, 64 - p.num_free - anon))
    q = copy.deepcopy(p)
    p.release_unshared(rid, anon, n)
    q.free(anon)
    q.release_private(rid, 0, n)
    assert _pool_state(p) == _pool_state(q)


def _rows(res) -> list:
    r = res.recorder
    return list(zip(r.t, r.num_running, r.num_waiting, r.kv_used_blocks, r.tokens_total))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(max_n=16, max_prompt=1500, max_output=300, max_gap=0.5), st.integers(1, 3),
       st.sampled_from([H100, H200]))
def test_unshared_release_is_the_general_one(req, slack, hw):
    # a trace without hash_ids frees through `KvBook.release_unshared`; the same trace with an
    # empty hash_ids list per request (no shared blocks either) through `KvBook.release`: the
    # same tokens, preemptions, samples and cache statistics, on a tight pool
    w, _, _, need = req
    blocks = need * slack
    empty = dataclasses.replace(w, hash_ids=tuple(np.zeros(0, dtype=np.int64)
                                                  for _ in range(w.num_requests)))
    kw = dict(enable_prefix_caching=True, num_gpu_blocks_override=blocks)
    a = simulate_point(w, "llama-3.1-8b", hw, "vllm", **kw)
    b = simulate_point(empty, "llama-3.1-8b", hw, "vllm", **kw)
    assert a.records.token_times_s.tobytes() == b.records.token_times_s.tobytes()
    assert np.array_equal(a.records.num_preemptions, b.records.num_preemptions)
    assert _rows(a) == _rows(b)
    assert a.stats["prefix_cache"] == b.stats["prefix_cache"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(max_n=16, max_prompt=1500, max_output=300, max_gap=0.5), st.integers(1, 3),
       st.booleans())
def test_leap_samples_are_the_stepped_ones(req, slack, pc):
    # every sample a leap's commit records (one per segment of a leap through finishes: the
    # running batch, KV blocks in use, tokens emitted so far) is the one stepping records
    # at the same time
    w, _, _, need = req
    kw = dict(enable_prefix_caching=pc, num_gpu_blocks_override=need * slack)
    a = simulate_point(w, "llama-3.1-8b", H100, "vllm", **kw)
    b = simulate_point(w, "llama-3.1-8b", H100, "vllm", leap=False, **kw)
    assert a.records.token_times_s.tobytes() == b.records.token_times_s.tobytes()
    stepped = {row[0]: row for row in _rows(b)}
    for row in _rows(a):
        assert stepped[row[0]] == row


def _table(prompt, output, window=None):
    from simserve.sim.requests import RequestTable
    from tests.helpers import workload
    return RequestTable(workload(np.zeros(len(prompt)), prompt, output), token_window=window)


def _twin_tables(prompt, output, window, had) -> tuple:
    """Two equal tables in which request i has already emitted had[i] tokens."""
    a, b = _table(prompt, output, window), _table(prompt, output, window)
    for x in (a, b):
        for step in range(max(had)):
            x.emit(np.array([i for i in range(len(had)) if had[i] > step], dtype=np.int64), 0.5)
    return a, b


def _table_state(t) -> tuple:
    tt = t.token_slice(0, t.n) if t.streaming else t.token_times
    return (tt.tobytes(), t.generated.tobytes(), t.num_tokens.tobytes(), t.finish.tobytes(),
            t.first_token.tobytes(), t.num_emitted, t.num_finished)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(2, 60), st.integers(1, 59)),
                min_size=1, max_size=12),
       st.integers(1, 40), st.sampled_from([None, 64]), st.booleans())
def test_emit_runs_is_emit_step_by_step(reqs, k, window, as_list):
    # requests that already have a token take min(k, left) steps of a leap through
    # finishes: one `emit_runs` call leaves the table (ring or not) as one `emit` per step
    # of the requests still running, and reports who finished after how many steps
    prompt = [p for p, _, _ in reqs]
    output = [o for _, o, _ in reqs]
    had = [min(h, o - 1) for (_, o, h) in reqs]
    times = [1.0 + 0.25 * i for i in range(k)]
    a, b = _twin_tables(prompt, output, window, had)
    ids = list(range(len(reqs)))
    steps = [min(k, o - h) for o, h in zip(output, had)]
    got = a.emit_runs(ids if as_list else np.array(ids, dtype=np.int64), times, had, steps)
    want = {}
    for s in range(k):
        live = [i for i in ids if steps[i] > s]
        if live:
            done = b.emit(live if as_list else np.array(live, dtype=np.int64), times[s])
            if len(done):
                want[s + 1] = list(done)
    assert {n: list(v) for n, v in got.items()} == want
    assert list(got) == sorted(got)
    assert _table_state(a) == _table_state(b)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(1, 300)), max_size=30),
       st.integers(1, 300), st.sampled_from([1, 16, 32]))
def test_new_blocks_are_each_requests_blocks_summed(batch, k, bs):
    # request i fits room[i] more tokens in its blocks and takes min(k, left[i]) tokens
    room, left = [a for a, _ in batch], [s for _, s in batch]
    assert new_blocks(room, k, bs) == sum(max(0, -(-(k - a) // bs)) for a in room)
    assert new_blocks_upto(room, left, k, bs) == sum(
        max(0, -(-(min(k, s) - a) // bs)) for a, s in batch)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 30)), min_size=1, max_size=60),
       st.integers(1, 30), st.sampled_from([None, 64]), st.booleans(), st.booleans())
def test_emit_steps_is_emit_step_by_step(reqs, k, window, as_list, counts):
    # every request takes all k steps (some finish at the last): small batches take
    # `emit_runs`' loop, larger ones numpy's calls (requests.SMALL_STEPS), either as one
    # `emit` per step
    prompt = [p for p, _ in reqs]
    had = [h for _, h in reqs]
    output = [h + k + (i % 2) for i, h in enumerate(had)]  # odd ones have a token left
    times = [1.0 + 0.5 * i for i in range(k)]
    a, b = _twin_tables(prompt, output, window, had)
    ids = list(range(len(reqs)))
    arr = np.array(ids, dtype=np.int64)
    got = a.emit_steps(ids if as_list else arr, times, had if counts else None)
    for s in range(k):
        done = b.emit(arr, times[s])
    assert list(got) == list(done)
    assert _table_state(a) == _table_state(b)
