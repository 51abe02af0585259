"""ConfluxServe's KV moves in closed form (`conflux.kv_moves`) land when the SimPy processes
of `SpRanksEngine._start_transfer` would: same ends on shared FIFO channels, and at a tie
between a move's end and the engine's own wake-up, the same side first; a whole run gives the
same token times either way."""
from __future__ import annotations

import numpy as np
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.policies.conflux.engine import XpInstance
from simserve.policies.conflux.kv_moves import KvMoves
from simserve.policies.sp_ranks import SpRanksEngine
from simserve.run import simulate_point
from simserve.sim.clock import at
from simserve.sim.cluster import Channel
from tests.helpers import workload

EIGHTH = 1.25e8  # bytes a 1 GB/s channel moves in 1/8 s: every time below is exact, so ties


class _Processes:
    """The processes' version, as `SpRanksEngine._start_transfer` and `_land` do it."""

    def __init__(self, env):
        self.env = env

    def start(self, channels, nbytes):
        return self.env.all_of([ch.start(nbytes) for ch in channels])

    @staticmethod
    def landed(ev):
        return ev.processed


def _engine(env, moves, channels, script, log):
    """`SpRanksEngine.run`'s shape: land, start this step's moves, then run an iteration
    (a wake-up at a time fixed when it starts) or wait for the moves. A wait for several
    moves that end apart is left out: SimPy's `any_of` over the processes' `all_of`s, once
    woken by one, strips the others' callbacks (`Condition._remove_check_callbacks`), so
    they never fire; the engine waits only when nothing can run, which the runs here never
    meet with two moves in flight. Two moves ending together are fine (both done first):
    kind "wait all" waits for them."""
    moving = []
    script = list(script)
    while script or moving:
        new, kind, eighths = script.pop(0) if script else ((), "wait", 1)
        keep = []
        for ev, rid in moving:
            if moves.landed(ev):
                log.append((rid, env.now))
            else:
                keep.append((ev, rid))
        moving = keep
        for rid, chans, k in new:
            moving.append((moves.start([channels[c] for c in chans], k * EIGHTH), rid))
        if (kind == "wait" and len(moving) == 1) or (kind == "wait all" and moving):
            yield env.any_of([ev for ev, _ in moving])
        else:
            yield at(env, env.now + eighths / 8)


def _run(script, closed: bool):
    env = simpy.Environment()
    channels = [Channel(env, f"nvlink{i}", 1.0, 0.0) for i in range(3)]
    moves = KvMoves(env) if closed else _Processes(env)
    log: list = []
    env.process(_engine(env, moves, channels, script, log))
    env.run()
    return log, [(c.num_transfers, c.bytes_moved, c.busy_s) for c in channels]


steps = st.lists(st.tuples(
    st.lists(st.tuples(st.integers(0, 99), st.sets(st.integers(0, 2), min_size=1).map(sorted),
                       st.integers(1, 6)), max_size=3),
    st.sampled_from(["iter", "iter", "wait"]), st.integers(1, 12)), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_closed_form_moves_land_when_the_processes_do(script):
    want = _run(script, closed=False)
    assert _run(script, closed=True) == want


def test_a_tie_with_the_engine_s_own_wake_up_goes_to_the_engine():
    # a move of 1/4 s started with an iteration of 1/4 s: in flight when the iteration ends
    script = [([(7, [0], 2)], "iter", 2), ((), "iter", 1)]
    log, _ = _run(script, closed=True)
    assert log == [(7, 0.375)] == _run(script, closed=False)[0]
    # waiting for two moves that end together lands both before the next iteration
    script = [([(1, [0], 2), (2, [1], 2)], "wait all", 0), ((), "iter", 1)]
    assert _run(script, closed=True)[0] == [(1, 0.25), (2, 0.25)] == _run(script, False)[0]


def test_conflux_run_is_the_same_with_processes_for_the_moves(monkeypatch):
    rng = np.random.default_rng(3)
    n = 40
    w = workload(np.cumsum(rng.exponential(0.2, n)), rng.integers(500, 16000, n),
                 rng.integers(5, 300, n))
    hw = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
    a = simulate_point(w, "qwen3-14b", hw, "conflux")
    monkeypatch.setattr(XpInstance, "_start_transfer", SpRanksEngine._start_transfer)
    b = simulate_point(w, "qwen3-14b", hw, "conflux")
    assert a.stats["conflux"]["num_kv_transfers"] == n == b.stats["conflux"]["num_kv_transfers"]
    assert np.array_equal(a.records.token_times_s, b.records.token_times_s)
