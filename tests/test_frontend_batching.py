"""The front end's batching stage (vLLM's API-server tokenizer batching): it gathers what
waits for it, runs one call priced from the profile, releases the batch together; engines
that do not ask for it keep the one-by-one front end."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simserve.cost.host import engine_host, with_batching
from simserve.errors import ConfigError
from simserve.hardware.profile import load_profile
from simserve.hardware.setup import HardwareConfig
from simserve.policies import vllm_engine, vllm_intake
from simserve.run import simulate_point
from simserve.sim.frontend import BatchStage
from simserve.workload.spec import Workload


def test_a_lone_request_pays_the_window_and_one_call():
    s = BatchStage(window_us=2000.0, max_size=32, call_us=1000.0, call_per_token_us=2.0)
    assert s.put(1.0, 7, 500)             # idle: it opens a batch
    assert s.start_at == pytest.approx(1.002)
    end = s.start(s.start_at)
    assert end == pytest.approx(1.002 + 1e-3 + 500 * 2e-6)
    assert s.finish(end) == [7] and s.start_at == float("inf") and len(s) == 0


def test_the_next_batch_is_what_waited_during_the_call_at_most_max_size():
    s = BatchStage(window_us=2000.0, max_size=32, call_us=1000.0, call_per_token_us=0.0)
    s.put(0.0, 0, 10)
    end = s.start(s.start_at)
    for r in range(1, 41):               # 40 arrive while the call runs: none joins it
        assert not s.put(0.0025, r, 10)
    assert s.finish(end) == [0]
    assert s.start_at == end              # 32 or more waiting: the next call starts at once
    end2 = s.start(s.start_at)
    assert s.batch == list(range(1, 33))
    assert s.calls[-1] == (end, 32, 320)
    assert s.finish(end2) == list(range(1, 33))
    assert s.start_at == pytest.approx(end2 + 0.002)   # the other 8 gather for the window
    s.start(s.start_at)
    assert s.batch == list(range(33, 41))


def test_a_full_batch_starts_before_its_window_ends():
    s = BatchStage(window_us=2000.0, max_size=3, call_us=0.0, call_per_token_us=0.0)
    s.put(0.0, 0, 1)
    assert not s.put(0.0005, 1, 1)
    assert s.put(0.001, 2, 1) and s.start_at == 0.001


def _reach_times(monkeypatch, w, **opts) -> list[float]:
    """When each request reaches the engine, with the profile's costs except the output
    work (which shares the CPU with admissions once tokens flow), set to 0."""
    seen = []
    orig = vllm_intake.Intake._admitted
    orig_host = vllm_engine.engine_host

    def host(profile, engine, version=None):
        h = orig_host(profile, engine, version)
        quiet = {"out_us": 0.0, "out_per_output_us": 0.0}
        return dataclasses.replace(h, frontend=dict(h.frontend, **quiet),
                                   frontend_batched=dict(h.frontend_batched, **quiet))
    monkeypatch.setattr(vllm_engine, "engine_host", host)

    def admitted(self, rid):
        seen.append(self.ctx.env.now)
        orig(self, rid)
    monkeypatch.setattr(vllm_intake.Intake, "_admitted", admitted)
    simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"), "vllm", engine="vllm",
                   **opts)
    return seen


def _groups(times) -> list[int]:
    vals, counts = np.unique(np.round(np.asarray(times), 9), return_counts=True)
    return counts.tolist()


def _predicted_groups(fe: dict, n: int, tokens: int) -> list[int]:
    """The batches a burst of `n` forms, from the profile's costs: admissions one after
    another on the CPU, then the stage (an independent walk through its rule)."""
    b = fe["batch_stage"]
    done = [(i + 1) * (fe["in_us"] + fe["in_per_token_us"] * tokens) for i in range(n)]
    groups, i, free = [], 0, 0.0
    while i < n:
        take = max(done[i], free)
        start = take + b["window_us"]
        j = i
        while j < n and j - i < b["max_size"] and done[j] <= start:
            j += 1
        groups.append(j - i)
        free = start + b["call_us"] + b["call_per_token_us"] * tokens * (j - i)
        i = j
    return groups


def test_a_burst_reaches_the_engine_in_the_groups_the_profile_predicts(monkeypatch):
    n, tokens = 16, 64
    w = Workload(arrival_s=np.zeros(n), prompt_tokens=np.full(n, tokens),
                 output_tokens=np.full(n, 8))
    fe = load_profile("h200-sxm").overheads["engines"]["vllm-0.22.1"]["frontend_batched"]
    want = _predicted_groups(fe, n, tokens)
    assert max(want) > 1                 # the burst does batch under the fitted costs
    assert _groups(_reach_times(monkeypatch, w, tokenizer_batching=True)) == want
    # without the stage every request reaches the engine on its own
    assert _groups(_reach_times(monkeypatch, w)) == [1] * n


def assert_leaping_equals_stepping(seed: int, n: int, horizon_s: float) -> None:
    """A random burst through the stage, leapt and stepped: the same first-token and finish
    times."""
    rng = np.random.default_rng(seed)
    w = Workload(arrival_s=np.sort(rng.uniform(0, horizon_s, n)),
                 prompt_tokens=rng.integers(32, 2048, n), output_tokens=rng.integers(4, 200, n))
    hw = HardwareConfig(gpu="h200-sxm")
    a, b = (simulate_point(w, "llama-3.1-8b", hw, "vllm", engine="vllm", tokenizer_batching=True,
                           leap=lp).records for lp in (True, False))
    assert np.array_equal(a.first_token_s, b.first_token_s)
    assert np.array_equal(a.finish_s, b.finish_s)


def test_leaping_gives_the_same_results_as_stepping_with_the_stage():
    assert_leaping_equals_stepping(3, 60, 1.5)


def test_default_front_end_has_no_stage_and_asking_without_a_fit_fails():
    host = engine_host(load_profile("h200-sxm"), "vllm")
    assert host.make_frontend().stage is None
    assert with_batching(host, False) is host
    assert with_batching(host, True).make_frontend().stage is not None
    w = Workload(arrival_s=np.array([0.0]), prompt_tokens=np.array([64]),
                 output_tokens=np.array([4]))
    with pytest.raises(ConfigError, match="tokenizer_batching"):
        simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"), "vllm",
                       engine="generic", tokenizer_batching=True)
