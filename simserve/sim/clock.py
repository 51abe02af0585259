"""Events at an absolute simulated time.

`env.timeout(t - env.now)` fires at `env.now + (t - env.now)`, which can miss t by an ulp. An
engine that works out in closed form when a chain of events would have happened (event
leaping) needs to wake exactly then, so that it sees the same clock as stepping would have.
"""
from __future__ import annotations

from heapq import heappush

import simpy
from simpy.core import NORMAL


def at(env: simpy.Environment, t: float) -> simpy.Event:
    """An event that fires at exactly `t` (≥ now), ordered among other events at `t` as a
    timeout created now would be (SimPy ≥ 4.1 keeps (time, priority, id, event) in a heap)."""
    if t < env.now:
        raise ValueError(f"at: {t!r} is in the past (now {env.now!r})")
    ev = simpy.Event(env)
    ev._ok = True
    ev._value = None
    heappush(env._queue, (t, NORMAL, next(env._eid), ev))
    return ev
