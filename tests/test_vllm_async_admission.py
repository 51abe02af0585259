"""vLLM's asynchronous scheduling admits a new request one step late: step m is scheduled
while step m-1 runs on the GPU, so a request that reaches the engine core after step m-1
began can join step m+1 at the earliest (vllm/v1/engine/core.py `step_with_batch_queue`,
batch queue of two). Found by serving the same plans with `--no-async-scheduling`
(validation/vllm-h200/*-sync): without this rule simserve's TTFT was 15-22 % low under async
scheduling only."""
from __future__ import annotations

import numpy as np
import pytest

from simserve.hardware.profile import load_profile
from simserve.hardware.setup import HardwareConfig
from simserve.policies.vllm_engine import ChunkedEngine
from simserve.policies.vllm_leaper import Leaper
from simserve.run import simulate_point
from simserve.workload.spec import Workload


def _trace(monkeypatch):
    steps, reached = [], {}
    shape, arrive = ChunkedEngine._shape, ChunkedEngine.arrive

    def rec_shape(self, ids, n):
        steps.append((self.clock, {int(r) for r in ids}))
        return shape(self, ids, n)

    def rec_arrive(self, rid):
        reached[rid] = self.ctx.env.now
        return arrive(self, rid)

    monkeypatch.setattr(ChunkedEngine, "_shape", rec_shape)
    monkeypatch.setattr(ChunkedEngine, "arrive", rec_arrive)
    return steps, reached


def _first_step(steps, rid):
    return next(k for k, (_, ids) in enumerate(steps) if rid in ids)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_request_joins_the_step_after_the_one_already_scheduled(monkeypatch, async_scheduling):
    steps, reached = _trace(monkeypatch)
    # request 0 keeps the engine busy (decode steps back to back); the others arrive mid-run
    w = Workload(arrival_s=np.array([0.0, 0.2013, 0.4507, 0.7001]),
                 prompt_tokens=np.array([3000, 40, 500, 64]),
                 output_tokens=np.array([400, 4, 4, 4]))
    simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"), "vllm", engine="vllm",
                   async_scheduling=async_scheduling, leap=False,
                   enable_prefix_caching=False)
    starts = [t for t, _ in steps]
    for rid in (1, 2, 3):
        k = _first_step(steps, rid)
        assert k >= 2
        if async_scheduling:   # the step before it was scheduled after the request arrived...
            assert starts[k - 1] >= reached[rid]
            assert starts[k - 2] < reached[rid]   # ...and no later than needed
        else:                  # the first step that starts after it arrives
            assert starts[k] >= reached[rid] > starts[k - 1]


def test_an_idle_engine_schedules_a_new_request_at_once(monkeypatch):
    steps, reached = _trace(monkeypatch)
    w = Workload(arrival_s=np.array([0.0, 5.0]), prompt_tokens=np.array([100, 100]),
                 output_tokens=np.array([3, 3]))
    simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"), "vllm", engine="vllm",
                   leap=False, enable_prefix_caching=False)
    k = _first_step(steps, 1)
    # at once, but for the engine-core loop's schedule call (the profile's fitted one)
    prof = load_profile("h200-sxm")
    sched = prof.overheads["engines"]["vllm-0.22.1"]["host_calls"]["piecewise"]["schedule_us"]
    assert reached[1] <= steps[k][0] <= reached[1] + sched * 1e-6 + 1e-9


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_a_leap_goes_on_through_the_step_scheduled_before_a_request_reached_it(
        monkeypatch, prefix_caching):
    # Under async scheduling the step after the one in flight when a request reaches the
    # engine was scheduled without it: one leap covers both (`Leaper._go_past`), with
    # the same token times as stepping and a sample where stepping's engine woke.
    commits = []
    commit = Leaper._commit

    def rec_commit(self, p, k):
        commits.append((p.reach_step, k, p.ends[p.reach_step - 1] if p.reach_step else None))
        return commit(self, p, k)

    monkeypatch.setattr(Leaper, "_commit", rec_commit)
    w = Workload(arrival_s=np.array([0.0, 0.01, 0.3013, 0.6007, 0.9001]),
                 prompt_tokens=np.array([3000, 2000, 40, 500, 64]),
                 output_tokens=np.array([300, 250, 4, 4, 4]))
    runs = [simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"), "vllm",
                           engine="vllm", leap=leap, enable_prefix_caching=prefix_caching)
            for leap in (True, False)]
    gone_on = [t for j, k, t in commits if j and k == j + 1]
    assert gone_on  # a leap went on one step past a request's arrival
    a, b = (r.records for r in runs)
    assert np.array_equal(a.token_times_s, b.token_times_s)
    assert runs[0].stats["num_iterations"] == runs[1].stats["num_iterations"]
    # every state a leap samples is one stepping passes through (one engine: tokens too)
    leapt, stepped = (r.recorder.frame() for r in runs)
    key = list(leapt.columns)
    assert len(leapt.merge(stepped, on=key)) == len(leapt) < len(stepped)
    waited = set(leapt.t_s[leapt.num_waiting > 0])
    assert set(gone_on) <= waited  # sampled where stepping's engine woke to the waiting request
