"""NEO's CPU decoding queue: request ids in FIFO order (swap-outs join at the front).

Every round reads the whole queue as an array (the mode decision scans it, the leap test
checks that none of it fits the pipeline), but only a few rounds change it. So the queue is a
deque that keeps that array until the next change: every mutating method drops it.
"""
from __future__ import annotations

from collections import deque

import numpy as np


class CpuQueue(deque):
    __slots__ = ("_ids",)

    def __init__(self, iterable=()):
        super().__init__(iterable)
        self._ids = None

    def ids(self) -> np.ndarray:
        """The ids in queue order (an array shared until the queue changes: do not write)."""
        a = self._ids
        if a is None:
            a = self._ids = np.fromiter(self, dtype=np.int64, count=len(self))
        return a


def _dropping_ids(name: str):
    base = getattr(deque, name)

    def method(self, *args):
        self._ids = None
        return base(self, *args)

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


for _name in ("append", "appendleft", "clear", "extend", "extendleft", "insert", "pop",
              "popleft", "remove", "reverse", "rotate", "__setitem__", "__delitem__",
              "__iadd__", "__imul__"):
    setattr(CpuQueue, _name, _dropping_ids(_name))
