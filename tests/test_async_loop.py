"""vLLM's async engine-core loop replayed on real steps (`realcheck.async_loop`): it drives
the runtime's own `EngineLoop`, files steps under the runtime's launch modes, and the cost
model keeps no host-call floor of its own."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simserve.cost.gpu import BatchShape
from simserve.policies import vllm_loop
from simserve.realcheck import async_loop
from simserve.realcheck.async_loop import graph_mode, idle_before, loop_outputs
from simserve.realcheck.step_diff import Step

# a profile's host_calls (µs): S, L per layer, U
CALLS = {"full": {"schedule_us": 200.0, "launch_us_per_layer": 50.0, "update_us": 100.0},
         "piecewise": {"schedule_us": 300.0, "launch_us_per_layer": 200.0, "update_us": 100.0},
         "eager": {"schedule_us": 800.0, "launch_us_per_layer": 600.0, "update_us": 300.0}}


def _step(t0_ms: float, reqs: dict, prompt: dict, update_ms: float | None = None) -> Step:
    s = Step(t0_ms * 1e-3, reqs, prompt)
    s.sched_t0 = s.t0
    s.update_t0 = None if update_ms is None else update_ms * 1e-3
    return s


def _shape(step: Step) -> BatchShape:
    pre = [n for i, (n, c) in step.reqs.items() if step.kind_of(i) == "P"]
    dec = [c + 1 for i, (n, c) in step.reqs.items() if step.kind_of(i) == "D"]
    return BatchShape(num_tokens=sum(n for n, _ in step.reqs.values()),
                      prefill_chunks=np.array(pre, dtype=np.int64),
                      prefill_ctx=np.zeros(len(pre), dtype=np.int64), num_decodes=len(dec),
                      decode_ctx_sum=sum(dec), num_sample_rows=len(step.reqs),
                      decode_ctx=np.array(dec, dtype=np.int64))


def _replay(steps, gpu_ms, gmax=512):
    return loop_outputs(steps, [_shape(s) for s in steps], np.array(gpu_ms) * 1e-3, CALLS,
                        10, gmax) * 1e3


def test_a_long_launch_delays_the_previous_steps_tokens():
    # two decode steps of 5 ms, then a 2048-token prefill chunk with one decode (eager,
    # 10 layers: launch 6 ms): the second decode's tokens wait for that launch
    p = {0: 100, 1: 4096}
    steps = [_step(0.0, {0: (1, 100)}, p), _step(0.5, {0: (1, 101)}, p, 5.0),
             _step(5.0, {0: (1, 102), 1: (2048, 0)}, p, 10.0)]
    out = _replay(steps, [5.0, 5.0, 40.0])
    # step 0 from idle at 0: GPU from S(full) = 0.2 to 5.2; step 1 back to back to 10.2
    assert out[0] == pytest.approx(5.2)
    # step 1 (full graph) began at 5.2: H = 5.2 + U(full); step 2's launch ends at
    # H + S + L (eager) = 5.3 + 0.8 + 6.0, after step 1's GPU end: step 1 sends then + U
    assert out[1] == pytest.approx(max(10.2, 5.3 + 0.8 + 6.0) + 0.3)
    assert out[2] == pytest.approx(max(10.2, 5.3 + 0.8) + 40.0)


def test_the_replay_runs_the_runtimes_engine_loop(monkeypatch):
    """The replay is `EngineLoop` itself: a change to the runtime's loop changes it."""
    seen = []
    real = vllm_loop.EngineLoop.host_step
    monkeypatch.setattr(vllm_loop.EngineLoop, "host_step",
                        lambda self, shape, clock: seen.append(shape) or real(self, shape, clock))
    p = {0: 100, 1: 300}
    steps = [_step(0.0, {0: (1, 100)}, p), _step(0.5, {0: (1, 101), 1: (300, 0)}, p, 5.0)]
    _replay(steps, [5.0, 8.0])
    assert len(seen) == 1


def test_an_idle_engine_sends_at_once():
    """Step 1's only request arrived after step 0's output was back and step 0's request
    had finished: the engine idled, and step 0's tokens went at its GPU end."""
    p = {0: 10, 1: 10}
    steps = [_step(0.0, {0: (10, 0)}, p), _step(100.0, {1: (10, 0)}, p, 3.7)]
    assert list(idle_before(steps)) == [True, True]
    out = _replay(steps, [3.0, 3.0])
    assert out[0] == pytest.approx(0.3 + 3.0)   # S(piecewise) + GPU, not delayed
    assert out[1] == pytest.approx(100.0 + 0.3 + 3.0)


def test_a_running_request_keeps_the_engine_busy():
    p = {0: 10, 1: 10}
    steps = [_step(0.0, {0: (10, 0)}, p), _step(100.0, {0: (1, 10), 1: (10, 0)}, p, 3.7)]
    assert list(idle_before(steps)) == [True, False]


def test_the_fit_and_the_runtime_file_a_step_under_one_launch_mode():
    """A decode-only batch beyond the largest capture size runs eager in vLLM: the fit files
    it so, and the runtime's loop prices it so (not as a full-graph replay)."""
    p = {i: 100 for i in range(600)}
    big = _step(0.0, {i: (1, 100) for i in range(600)}, p)
    small = _step(0.0, {i: (1, 100) for i in range(64)}, p)
    mixed = _step(0.0, {0: (1, 100), 1: (99, 0)}, p)
    loop = vllm_loop.EngineLoop(None, vllm_loop.calls_s(CALLS), 512, 10)
    for s, want in ((big, "eager"), (small, "full"), (mixed, "piecewise")):
        assert graph_mode(s, 512) == want
        assert loop.mode(_shape(s)) == want
    assert not loop.leaps(600) and loop.leaps(64)
    no_graphs = vllm_loop.EngineLoop(None, vllm_loop.calls_s(CALLS), 0, 10)
    assert no_graphs.mode(_shape(small)) == "eager" == graph_mode(small, 0)


def test_the_fit_reads_the_servers_capture_sizes():
    assert async_loop.graph_max({"cudagraph_capture_sizes": [1, 2, 256]}) == 256
    assert async_loop.graph_max({"cudagraph_mode": "NONE",
                                 "cudagraph_capture_sizes": [1, 512]}) == 0


def test_the_cost_model_has_no_host_call_floor():
    """Only the runtime's engine loop uses the host calls: a step's price does not depend on
    them (whoever calls `step_s`)."""
    from simserve.cost import GpuCostModel
    from simserve.cost.host import engine_host
    from simserve.hardware.profile import load_profile
    from simserve.models import get_model
    prof = load_profile("h200-sxm")
    host = engine_host(prof, "vllm")
    assert host.host_calls, "h200-sxm's vllm-0.22.1 entry has its host calls"
    m = get_model("llama-3.1-8b")
    with_calls = GpuCostModel(m, prof, table_tokens=8192, host=host)
    without = GpuCostModel(m, prof, table_tokens=8192,
                           host=dataclasses.replace(host, host_calls=None))
    d = np.full(40, 300, dtype=np.int64)
    small = BatchShape(num_tokens=72, prefill_chunks=np.array([32]), prefill_ctx=np.array([0]),
                       num_decodes=40, decode_ctx_sum=int(d.sum()), num_sample_rows=41,
                       decode_ctx=d)
    assert with_calls.step_s(small) == without.step_s(small)
