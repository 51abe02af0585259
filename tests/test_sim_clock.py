"""`sim.clock.at`: an event at an exact simulated time, ordered like a timeout made then."""
from __future__ import annotations

import pytest
import simpy

from simserve.policies.signal import sleep_until
from simserve.sim.clock import BEHIND_NORMAL, at, fire_at


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


def test_behind_normal_fires_after_normal_events_at_its_time():
    # what a closed-form landing needs (fire_at with BEHIND_NORMAL): after every process
    # step scheduled at the same time, whatever was created first
    env = simpy.Environment()
    order = []
    late = simpy.Event(env)
    fire_at(env, late, 2.0, BEHIND_NORMAL)
    late.callbacks.append(lambda _: order.append("behind"))
    env.timeout(2.0).callbacks.append(lambda _: order.append("timeout"))
    env.run()
    assert order == ["timeout", "behind"] and late.ok


def test_sleep_until_lands_exactly_and_reports_a_wake():
    env = simpy.Environment(initial_time=0.00016189957807444255)
    t = 1.5018256178447797
    wake = env.event()
    got = []

    def sleeper(w):
        woken = yield from sleep_until(env, t, w)
        got.append((env.now, woken))

    env.process(sleeper(None))
    env.process(sleeper(wake))
    env.timeout(0.5).callbacks.append(lambda _: wake.succeed())
    env.run()
    assert sorted(got) == [(0.50016189957807444255, True), (t, False)]
