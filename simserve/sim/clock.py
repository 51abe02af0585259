"""Events at an absolute simulated time: the one place simserve reaches into SimPy's internals.

`env.timeout(t - env.now)` fires at `env.now + (t - env.now)`, which can miss t by an ulp. An
engine that works out in closed form when a chain of events would have happened (event
leaping) needs to wake exactly then, so that it sees the same clock as stepping would have.
SimPy has no public call for that, so `fire_at` puts an event on its heap directly
(tests/test_sim_clock.py pins the behaviour against SimPy's own timeouts).
"""
from __future__ import annotations

from heapq import heappush

import simpy
from simpy.core import NORMAL


BEHIND_NORMAL = NORMAL + 1  # a priority that fires after URGENT and NORMAL events at its time


def fire_at(env: simpy.Environment, ev: simpy.Event, t: float, priority: int = NORMAL) -> None:
    """Trigger the untriggered event `ev` (successfully, value None) at exactly `t` (≥ now),
    ordered among other events at `t` by `priority`, then as one created now (SimPy ≥ 4.1
    keeps (time, priority, id, event) in a heap)."""
    if t < env.now:
        raise ValueError(f"at: {t!r} is in the past (now {env.now!r})")
    ev._ok = True
    ev._value = None
    queue: list = env._queue
    heappush(queue, (t, priority, next(env._eid), ev))


def at(env: simpy.Environment, t: float) -> simpy.Event:
    """An event that fires at exactly `t` (≥ now), ordered among other events at `t` as a
    timeout created now would be."""
    ev = simpy.Event(env)
    fire_at(env, ev, t)
    return ev
