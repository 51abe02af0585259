"""Pieces of NEO's loop that replace slower equivalents: the mode decision's candidate loop
(slack terms held as locals, one budget counter, the first fit by argmax) against NEO's scan
written plainly, the blocks a leap needs (from each decode's room in its blocks) and the CPU
queue's cached id array."""
from __future__ import annotations

from collections import deque

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.policies.neo.cpu_queue import CpuQueue
from simserve.policies.neo.engine import blocks_beyond
from simserve.policies.neo.mode import decide
from simserve.policies.neo.predictor import SubBatch
from tests.helpers import workload
from tests.test_neo import LinearPredictor, _engine, scenarios


def _plain_scan(pred, pg, n_gdec, gdec_ctx, lens, grow, rows, toks, host_free):
    """NEO's CPU-decode scan as policies.md §1.3 states it, on SubBatch objects: each
    candidate in queue order joins the sub-batch with the larger slack unless a slack goes
    negative (it is then rejected, and so is every later one at least as long) or it needs a
    host block and none is free; stop when the row or token budget is spent."""
    b0 = SubBatch(len(pg), sum(pg), float(sum(pred.pref(x) for x in pg)), n_gdec, gdec_ctx)
    b1 = SubBatch()
    chosen, nxt, min_bad = ([], []), 1, None
    for rid, (ln, gr) in enumerate(zip(lens, grow)):
        if rows < 1 or toks < 1:
            break
        if (min_bad is not None and ln >= min_bad) or (gr and host_free <= 0):
            continue
        b = (b0, b1)[nxt]
        b.n_cdec += 1
        b.cdec_ctx += ln
        s0, s1 = pred.slacks(b0, b1)
        if min(s0, s1) < 0:
            b.n_cdec -= 1
            b.cdec_ctx -= ln
            min_bad = ln
            continue
        chosen[nxt].append(rid + 100)
        rows, toks, host_free = rows - 1, toks - 1, host_free - gr
        nxt = 1 if s1 > s0 else 0
    return chosen, (b0.n_cdec, b0.cdec_ctx, b1.n_cdec, b1.cdec_ctx)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=60), st.data())
def test_candidate_loop_is_the_plain_scan(lens, data):
    pred = LinearPredictor(a=data.draw(st.floats(0, 50)), b=data.draw(st.floats(0.05, 20)),
                           lnch=data.draw(st.floats(0, 30)))
    grow = data.draw(st.lists(st.integers(0, 1), min_size=len(lens), max_size=len(lens)))
    pg = data.draw(st.lists(st.integers(1, 2000), max_size=3))
    n_gdec = data.draw(st.integers(0, 5))
    gdec_ctx = n_gdec * data.draw(st.integers(1, 3000))
    rows, toks = data.draw(st.integers(0, 40)), data.draw(st.integers(0, 40))
    host_free = data.draw(st.integers(0, 8))
    if not pg and not n_gdec:
        n_gdec, gdec_ctx = 1, 500
    d = decide(pred, pg, [], n_gdec, gdec_ctx, np.arange(len(lens)) + 100,
               np.asarray(lens, dtype=np.int64), np.asarray(grow, dtype=np.int64), rows, toks,
               host_free, 128)
    chosen, sums = _plain_scan(pred, pg, n_gdec, gdec_ctx, lens, grow, rows, toks, host_free)
    assert (d.b0.n_cdec, d.b0.cdec_ctx, d.b1.n_cdec, d.b1.cdec_ctx) == sums
    if d.mode == "pipe":
        assert d.cdec == (tuple(chosen[0]), tuple(chosen[1]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 40)), min_size=1, max_size=40),
       st.integers(0, 200), st.sampled_from([1, 16, 32]))
def test_blocks_beyond_is_the_growth_of_every_decode(decodes, k, bs):
    # held = ceil(tokens / bs) + spare (a decode may hold more than its tokens need)
    held = [-(-x // bs) + spare for x, spare in decodes]
    c = [x for x, _ in decodes]
    want = sum(max(h, -(-(x + k) // bs)) for h, x in zip(held, c)) - sum(held)
    rooms = sorted(h * bs - x for h, x in zip(held, c))
    assert blocks_beyond(rooms, k, bs) == want


def test_cpu_queue_ids_follow_every_change():
    q = CpuQueue([3, 4])
    ref = deque([3, 4])             # the same changes on a plain deque
    steps = [("appendleft", 1), ("append", 9), ("popleft",), ("extend", [5, 6]),
             ("extend", []), ("remove", 5), ("append", 3), ("remove", 3), ("remove", 9),
             ("extendleft", [7]), ("pop",), ("remove", 4), ("insert", 1, 8), ("rotate", 1),
             ("reverse",), ("__setitem__", 0, 2), ("__delitem__", 1), ("__iadd__", [11]),
             ("__imul__", 2), ("clear",), ("extend", [4]), ("popleft",)]
    for name, *args in steps:
        assert np.array_equal(q.ids(), list(ref))      # cached before the change
        getattr(q, name)(*args)
        getattr(ref, name)(*args)
        assert list(q) == list(ref)
        assert np.array_equal(q.ids(), np.array(list(ref), dtype=np.int64))


def _run_checking_host_blocks(w, **params) -> int:
    """Run NEO and check after every round and leap that the requests holding host blocks
    are exactly those in the CPU queue (`_finish` looks for finished requests in the queue
    only among them) and that the queue's cached ids are its contents; returns the most
    requests seen on the host."""
    e = _engine(w, **params)
    sample, seen = e._sample, [0]

    def check():
        on_host = set(np.flatnonzero(e.host_blocks).tolist())
        assert set(e.cpu_q) == on_host and len(e.cpu_q) == len(on_host)
        assert np.array_equal(e.cpu_q.ids(), np.array(list(e.cpu_q), dtype=np.int64))
        seen.append(len(on_host))
        sample()

    e._sample = check
    ctx = e.ctx
    ctx.source.handler = e.enqueue
    ctx.env.process(ctx.source.run())
    ctx.env.run()
    assert ctx.table.num_finished == w.num_requests
    return max(seen)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_a_request_holds_host_blocks_exactly_while_it_is_in_the_cpu_queue(sc):
    w, params = sc
    _run_checking_host_blocks(w, **params)


def test_host_blocks_and_cpu_queue_agree_under_kv_pressure():
    rng = np.random.default_rng(3)
    n = 60
    w = workload(np.cumsum(rng.exponential(0.05, n)), rng.integers(300, 1500, n),
                 rng.integers(50, 200, n))
    assert _run_checking_host_blocks(w, num_gpu_blocks_override=400,
                                     num_cpu_blocks_override=20000) >= 10
