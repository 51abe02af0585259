"""Pieces of NEO's leap and round that replace slower equivalents: the blocks a leap needs
(from each decode's room in its blocks) and the CPU queue's cached id array."""
from __future__ import annotations

from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.policies.neo.cpu_queue import CpuQueue
from simserve.policies.neo.engine import blocks_beyond


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
             ("extendleft", [7]), ("pop",), ("remove", 4), ("insert", 1, 8), ("rotate", 1),
             ("reverse",), ("__setitem__", 0, 2), ("__delitem__", 1), ("__iadd__", [11]),
             ("__imul__", 2), ("clear",)]
    for name, *args in steps:
        assert np.array_equal(q.ids(), list(ref))      # cached before the change
        getattr(q, name)(*args)
        getattr(ref, name)(*args)
        assert list(q) == list(ref)
        assert np.array_equal(q.ids(), np.array(list(ref), dtype=np.int64))
