"""NEO's CPU decoding queue: request ids in FIFO order (swap-outs join at the front).

Every round reads the whole queue as an array (the mode decision scans it, the leap test
checks that none of it fits the pipeline), but only a few rounds change it, and then mostly
at its ends. So the queue is a deque that keeps that array: the changes rounds make (swap-outs
to the front, swap-ins from it, Prefill-to-CPU prompts to the back, finished requests out)
update it with a slice or a concatenation, and any other change drops it until it is read.
"""
from __future__ import annotations

from collections import deque

import numpy as np


def _one(x) -> np.ndarray:
    return np.array([x], dtype=np.int64)


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

    def popleft(self):
        x = deque.popleft(self)
        if self._ids is not None:
            self._ids = self._ids[1:]
        return x

    def appendleft(self, x) -> None:
        deque.appendleft(self, x)
        if self._ids is not None:
            self._ids = np.concatenate((_one(x), self._ids))

    def append(self, x) -> None:
        deque.append(self, x)
        if self._ids is not None:
            self._ids = np.concatenate((self._ids, _one(x)))

    def extend(self, xs) -> None:
        xs = list(xs)
        deque.extend(self, xs)
        if self._ids is not None and xs:
            self._ids = np.concatenate((self._ids, np.asarray(xs, dtype=np.int64)))

    def remove(self, x) -> None:
        deque.remove(self, x)                    # the first x (raises if there is none)
        a = self._ids
        if a is not None:
            i = int((a == x).argmax())
            self._ids = np.concatenate((a[:i], a[i + 1:]))


def _dropping_ids(name: str):
    base = getattr(deque, name)

    def method(self, *args):
        self._ids = None
        return base(self, *args)

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


for _name in ("clear", "extendleft", "insert", "pop", "reverse", "rotate", "__setitem__",
              "__delitem__", "__iadd__", "__imul__"):
    setattr(CpuQueue, _name, _dropping_ids(_name))
