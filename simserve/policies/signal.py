"""A re-armable wake-up for engine processes (shared by `distserve` and `muxwise`)."""
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
