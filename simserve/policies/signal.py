"""Wake-ups and exact sleeps for engine processes (shared by `distserve` and `muxwise`)."""
from __future__ import annotations

from simserve.sim.clock import at


class Signal:
    """`wait()` returns an event that the next `fire()` triggers; firing with nobody waiting
    is a no-op (the waiter re-checks its state before waiting)."""

    def __init__(self, env):
        self.env, self._ev = env, None

    def wait(self):
        if self._ev is None or self._ev.triggered:
            self._ev = self.env.event()
        return self._ev

    def fire(self) -> None:
        if self._ev is not None and not self._ev.triggered:
            self._ev.succeed()


def sleep_until(env, t: float, wake=None):
    """A process step: sleep until exactly `t` (env.now == t afterwards, bit for bit:
    `simserve.sim.clock.at`) or until `wake` triggers; returns True if woken. Other processes
    then see the same clock whether an engine leapt or stepped there."""
    if env.now >= t:
        return False
    ev = at(env, t)
    yield ev if wake is None else ev | wake
    return wake is not None and wake.triggered
