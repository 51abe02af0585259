"""vLLM's running batch has one fast path (`_running_fit`, a typed loop taken while every
request's blocks fit) and the reference loop it must agree with (`_running_preempting`)."""
from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.policies.vllm import VllmScheduler
from simserve.policies.vllm_engine_config import ChunkedConfig
from simserve.policies.vllm_kv import KvBook


def _state(reqs, budget, num_blocks, bs):
    n = len(reqs)
    t = SimpleNamespace(**{k: np.zeros(n, dtype=np.int64) for k in
                           ("computed", "blocks", "num_tokens", "generated", "output",
                            "preemptions")})
    for r, (comp, need) in enumerate(reqs):
        t.computed[r], t.num_tokens[r] = comp, comp + need
        t.blocks[r] = -(-comp // bs)
    kv = KvBook(t, "gpu", num_blocks, bs, caching=False)
    kv.pool.allocate(int(t.blocks.sum()))
    s = SimpleNamespace(running=list(range(n)), waiting=deque(), budget=budget, kv=kv, table=t)
    s.preempt = lambda rid: (s.running.remove(rid), kv.drop(rid), s.waiting.appendleft(rid))
    return s


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 400)), min_size=1, max_size=70),
       st.integers(1, 2048), st.integers(0, 60), st.sampled_from([1, 16]))
def test_the_fast_path_gives_the_reference_result_whenever_it_applies(reqs, budget, slack, bs):
    held = sum(-(-c // bs) for c, _ in reqs)
    sched = VllmScheduler(ChunkedConfig())
    fast, ref = (_state(reqs, budget, max(1, held + slack), bs) for _ in range(2))
    ids, n, pre = sched.schedule_running(fast)
    rids, rn, rpre = sched._running_preempting(ref)
    if rpre:  # the reference preempted: the fast path must have handed over to it
        assert pre and list(ids) == list(rids)
        return
    assert not pre
    assert [int(x) for x in ids] == [int(x) for x in rids]
    assert [int(x) for x in n] == [int(x) for x in rn]
    assert np.array_equal(fast.table.blocks, ref.table.blocks)
    assert fast.kv.pool.num_used == ref.kv.pool.num_used
