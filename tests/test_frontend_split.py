"""The admission split around the tokenizer stage (the API server's handler: work on the event
loop before the tokenizer, a delay, the batched call on its own thread, then each request's
work after it queued on the same loop): requests reach the engine as an independent walk
through that rule predicts; leaping matches stepping; the profile's front ends do not split."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simserve.cost.host import engine_host
from simserve.hardware.profile import load_profile
from simserve.hardware.setup import HardwareConfig
from simserve.policies import vllm_engine, vllm_intake
from simserve.run import simulate_point
from simserve.sim.frontend import BatchStage, FrontEnd
from simserve.workload.spec import Workload
from tests.test_frontend_batching import assert_leaping_equals_stepping

SPLIT = {"in_us": 1000.0, "in_per_token_us": 0.0, "pre_delay_us": 1000.0, "post_us": 100.0,
         "post_per_token_us": 0.5, "in_delay_us": 3000.0, "out_us": 0.0,
         "out_per_output_us": 0.0, "out_delay_us": 0.0,
         "batch_stage": {"window_us": 2000.0, "max_size": 32, "call_us": 1410.0,
                         "call_per_token_us": 1.71}}


def test_work_past_the_stage_queues_behind_what_waits_on_the_cpu():
    fe = FrontEnd(1000.0, 0.0, 0.0, 0.0, stage=BatchStage(2000.0, 32, 0.0, 0.0), post_us=500.0)
    assert fe.split
    fe.admit(0.0, 10)
    fe.admit(0.0, 10)
    fe.admit_work(0.0005, 0.0005)        # queued after the two admissions
    assert fe.head_done == pytest.approx(0.001)
    fe.pop(0.001)
    fe.pop(0.002)
    assert fe.head_done == pytest.approx(0.0025)
    assert not FrontEnd(1000.0, 0.0, 0.0, 0.0, post_us=500.0).split   # no stage: no split
    assert not FrontEnd(1000.0, 0.0, 0.0, 0.0, stage=BatchStage(2000.0, 32, 0.0, 0.0)).split


def _with_split(monkeypatch, fe: dict) -> None:
    orig = vllm_engine.engine_host

    def host(profile, engine, version=None):
        return dataclasses.replace(orig(profile, engine, version), frontend_batched=dict(fe))
    monkeypatch.setattr(vllm_engine, "engine_host", host)


def _reach_times(monkeypatch, w) -> list[float]:
    seen = []
    orig = vllm_intake.Intake._admitted

    def admitted(self, rid):
        seen.append(self.ctx.env.now)
        orig(self, rid)
    monkeypatch.setattr(vllm_intake.Intake, "_admitted", admitted)
    simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"), "vllm", engine="vllm",
                   tokenizer_batching=True)
    return seen


def _predicted(fe: dict, n: int, tokens: int) -> list[float]:
    """A burst at t = 0: the n handlers' work before the tokenizer runs first (all queued at
    0), the stage gathers what its delay has passed, and each released request's work past
    the stage waits on the CPU behind every handler still queued. Interleaved, the handlers
    go on in full batches, the rest when the last handler is done."""
    us = 1e-6
    b = fe["batch_stage"]
    done = [(i + 1) * fe["in_us"] * us for i in range(n)]
    if fe.get("pre_interleave"):
        m = b["max_size"]
        done = [done[min((i // m + 1) * m, n) - 1] for i in range(n)]
    put = [d + fe["pre_delay_us"] * us for d in done]
    releases, i, free = [], 0, 0.0
    while i < n:
        start = max(put[i], free) + b["window_us"] * us
        j = i
        while j < n and j - i < b["max_size"] and put[j] <= start:
            j += 1
        free = start + (b["call_us"] + b["call_per_token_us"] * tokens * (j - i)) * us
        releases += [free] * (j - i)
        i = j
    cpu, out = n * fe["in_us"] * us, []
    for r in releases:
        cpu = max(cpu, r) + (fe["post_us"] + fe["post_per_token_us"] * tokens) * us
        out.append(cpu + fe["in_delay_us"] * us)
    return out


def test_a_burst_reaches_the_engine_as_the_split_predicts(monkeypatch):
    n, tokens = 16, 64
    w = Workload(arrival_s=np.zeros(n), prompt_tokens=np.full(n, tokens),
                 output_tokens=np.full(n, 8))
    _with_split(monkeypatch, SPLIT)
    want = _predicted(SPLIT, n, tokens)
    assert want[0] > n * SPLIT["in_us"] * 1e-6   # the first batch's work waits for the handlers
    assert _reach_times(monkeypatch, w) == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("n", [16, 40])
def test_interleaved_handlers_reach_the_stage_together(monkeypatch, n):
    tokens = 64
    w = Workload(arrival_s=np.zeros(n), prompt_tokens=np.full(n, tokens),
                 output_tokens=np.full(n, 8))
    fe = dict(SPLIT, pre_interleave=True)
    _with_split(monkeypatch, fe)
    want = _predicted(fe, n, tokens)
    assert want != pytest.approx(_predicted(SPLIT, n, tokens))   # the rule matters here
    assert _reach_times(monkeypatch, w) == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("interleave", [False, True])
def test_leaping_gives_the_same_results_as_stepping_with_the_split(monkeypatch, interleave):
    _with_split(monkeypatch, dict(SPLIT, out_us=50.0, out_per_output_us=30.0,
                                  pre_interleave=interleave))
    assert_leaping_equals_stepping(5, 80, 1.0)


def test_the_profiles_front_ends_do_not_split():
    host = engine_host(load_profile("h200-sxm"), "vllm")
    assert not host.make_frontend().split
    assert not dataclasses.replace(host, frontend=host.frontend_batched).make_frontend().split
