"""Waiting queues shared by the ConfluxServe baselines: FCFS and SRPT ("++" variants).

ConfluxServe §8.1 enhances every baseline with the same SRPT-style order: the waiting request
with the fewest remaining prefill tokens goes first. A waiting request's remaining prefill
(prompt plus any outputs to recompute, minus tokens with KV) does not change while it waits,
so the key is taken once, on entry; ties go to the lower request id (earlier arrival).
Both queues offer the deque operations the engines use: append, appendleft, popleft,
[0], len, truth, iteration (in service order).
"""
from __future__ import annotations

import heapq
from collections import deque

SCHEDULERS = ("fcfs", "srpt")


class SrptQueue:
    """Min-heap on (remaining prefill tokens, request id)."""

    def __init__(self, table):
        self.table = table
        self._heap: list[tuple[int, int]] = []

    def _key(self, rid: int) -> tuple[int, int]:
        t = self.table
        return int(t.num_tokens[rid] - t.computed[rid]), int(rid)

    def append(self, rid: int) -> None:
        heapq.heappush(self._heap, self._key(rid))

    appendleft = append  # a preempted request is ordered by its (recompute) length too

    def popleft(self) -> int:
        return heapq.heappop(self._heap)[1]

    def __getitem__(self, i: int) -> int:
        if i != 0:
            raise IndexError("SrptQueue: only the head ([0]) can be read")
        return self._heap[0][1]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self):
        return (rid for _, rid in sorted(self._heap))


def make_queue(scheduler: str, table):
    if scheduler == "fcfs":
        return deque()
    if scheduler == "srpt":
        return SrptQueue(table)
    raise ValueError(f"scheduler: expected one of {', '.join(SCHEDULERS)}, got {scheduler!r}")


def check_scheduler(value) -> None:
    if value not in SCHEDULERS:
        raise ValueError(f"scheduler: expected one of {', '.join(SCHEDULERS)}, got {value!r}")
