"""`sim.clock.at`: an event at an exact simulated time, ordered like a timeout made then."""
from __future__ import annotations

import pytest
import simpy

from simserve.sim.clock import at


def test_fires_at_exactly_the_time_a_timeout_may_miss():
    env = simpy.Environment(initial_time=0.00016189957807444255)
    t = 1.5018256178447797
    assert env.now + (t - env.now) != t                # the delay form lands an ulp off
    seen = []

    def proc():
        yield at(env, t)
        seen.append(env.now)

    env.process(proc())
    env.run()
    assert seen == [t]


def test_same_time_events_keep_creation_order_and_past_times_are_refused():
    env = simpy.Environment()
    order = []
    for name, ev in (("timeout", env.timeout(1.0)), ("at", at(env, 1.0)),
                     ("later", env.timeout(1.0))):
        ev.callbacks.append(lambda _, n=name: order.append(n))
    env.run()
    assert order == ["timeout", "at", "later"] and env.now == 1.0
    with pytest.raises(ValueError, match="past"):
        at(env, 0.5)
