"""A vLLM leap runs on through finishes (`policies/vllm_leap.py`) exactly as stepping would."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.policies.vllm_leaper import Leaper
from simserve.policies.vllm_leap import Segments, new_blocks, new_blocks_upto
from simserve.run import simulate_point
from tests.helpers import H100, H200, workload


def _samples(res) -> dict:
    f = res.recorder.frame()
    return {t: (r, kv) for t, r, kv in zip(f.t_s, f.num_running, f.kv_used_blocks)}


@pytest.mark.parametrize("hw", [H100, H200], ids=["h100", "h200-frontend"])
def test_one_leap_carries_a_batch_through_its_finishes(hw, monkeypatch):
    # four requests prefilled together, then nothing arrives: their decodes are one leap,
    # committed once, with the tokens, the KV peak and the samples at every finish (running
    # requests, KV blocks in use) that stepping gives
    w = workload([0.0] * 4, [100] * 4, [40, 90, 150, 220])
    commits = []
    commit = Leaper._commit
    monkeypatch.setattr(Leaper, "_commit",
                        lambda self, p, k: (commits.append(len(p.starts)), commit(self, p, k)))
    a = simulate_point(w, "llama-3.1-8b", hw, "vllm", num_gpu_blocks_override=64)
    b = simulate_point(w, "llama-3.1-8b", hw, "vllm", num_gpu_blocks_override=64, leap=False)
    np.testing.assert_array_equal(a.records.token_times_s, b.records.token_times_s)
    assert a.stats["peak_kv_blocks"] == b.stats["peak_kv_blocks"]
    assert a.stats["num_iterations"] == b.stats["num_iterations"]
    assert max(commits) == 4 and len(commits) <= 2  # the four batches in one leap
    sa, sb = _samples(a), _samples(b)
    fin = [t for t in sa if sa[t][0] < 4]
    assert len(fin) >= 3
    for t in fin:
        assert sa[t] == sb[t]


def test_a_leap_stops_at_the_first_finish_while_a_request_waits(monkeypatch):
    # a request waiting for KV could be admitted once a finish frees blocks: no segments
    w = workload([0.0, 0.0, 0.0], [600, 600, 600], [30, 60, 40])
    starts = []
    commit = Leaper._commit
    monkeypatch.setattr(Leaper, "_commit",
                        lambda self, p, k: (starts.append((len(p.starts), len(self.engine.waiting))),
                                            commit(self, p, k)))
    a = simulate_point(w, "llama-3.1-8b", H100, "vllm", num_gpu_blocks_override=80)
    b = simulate_point(w, "llama-3.1-8b", H100, "vllm", num_gpu_blocks_override=80, leap=False)
    np.testing.assert_array_equal(a.records.token_times_s, b.records.token_times_s)
    assert any(q for _, q in starts)  # some leap ran with a request waiting
    assert all(n == 1 for n, q in starts if q)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.integers(1, 300)), min_size=1, max_size=20),
       st.integers(0, 40))
def test_segments_are_the_batch_each_step_decodes(batch, s0):
    c = [x for x, _ in batch]
    r = [y for _, y in batch]
    B, s, m, end = Segments(c, r).segment(s0)
    on = [i for i in range(len(r)) if r[i] > s0]
    assert B == len(on)
    if on:
        assert s == sum(c[i] + s0 + 1 for i in on) and m == max(c[i] + s0 + 1 for i in on)
        assert end == min(r[i] for i in on)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 15), st.integers(1, 80)), min_size=1, max_size=12),
       st.integers(0, 90))
def test_blocks_of_a_leap_through_finishes(batch, k):
    room = [x for x, _ in batch]
    left = [y for _, y in batch]
    assert new_blocks_upto(room, left, k, 16) == sum(
        new_blocks([a], min(k, s), 16) for a, s in zip(room, left))
