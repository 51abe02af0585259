"""Wake-ups and exact sleeps for engine processes (shared by `distserve` and `muxwise`)."""
from __future__ import annotations


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
    """A process step: sleep until exactly `t` (env.now == t afterwards, bit for bit) or until
    `wake` triggers; returns True if woken. SimPy lands at now + (t - now), which is t only when
    t - now is exact: by Sterbenz's lemma when now >= t/2, so a long sleep first hops to 0.75·t.
    Other processes then see the same clock whether an engine leapt or stepped there."""
    while env.now < t:
        hop = t if env.now >= 0.5 * t else 0.75 * t
        ev = env.timeout(hop - env.now)
        yield ev if wake is None else ev | wake
        if wake is not None and wake.triggered:
            return True
    return False
