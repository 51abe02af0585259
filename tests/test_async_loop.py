"""vLLM's async engine-core loop: the replay of `realcheck.async_loop`, and the lower bound
its host calls put on a prefill step's duration in the cost model (`host_calls`)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simserve.realcheck.async_loop import loop_outputs
from simserve.realcheck.step_diff import Step

CALLS = {"full": {"S": 0.2, "L": 0.05, "U": 0.1},
         "piecewise": {"S": 0.3, "L": 0.2, "U": 0.1},
         "eager": {"S": 0.8, "L": 0.6, "U": 0.3}}


def _step(t0_ms: float, reqs: dict, prompt: dict) -> Step:
    s = Step(t0_ms * 1e-3, reqs, prompt)
    s.sched_t0 = s.t0
    return s


def test_a_long_launch_delays_the_previous_steps_tokens():
    # two decode steps of 5 ms, then a 2048-token prefill chunk with one decode (eager,
    # 10 layers: launch 6 ms): the second decode's tokens wait for the launch
    p = {0: 100, 1: 4096}
    steps = [_step(0.0, {0: (1, 100)}, p), _step(0.5, {0: (1, 101)}, p),
             _step(5.0, {0: (1, 102), 1: (2047, 0)}, p)]
    out = loop_outputs(steps, np.array([5.0, 5.0, 40.0]), CALLS, layers=10)
    # step 1 was launched at 0 + 0.2 + 0.5 (full graph, 10 layers) and ran after step 0
    assert out[0] == pytest.approx(5.0 + 0.2 + 0.1)       # step 1's launch was short
    launch_end = out[0] + 0.8 + 6.0                      # host loop after step 0's output
    assert out[1] == pytest.approx(max(10.2, launch_end) + 0.3)
    assert out[1] > 10.2 + 0.3                           # later than its GPU end


def test_an_idle_engine_sends_at_once():
    p = {0: 10, 1: 10}
    steps = [_step(0.0, {0: (10, 0)}, p), _step(100.0, {1: (10, 0)}, p)]
    out = loop_outputs(steps, np.array([3.0, 3.0]), CALLS, layers=10)
    assert out[0] == pytest.approx(3.0 + 0.3 + 0.1)  # its own GPU end + U, not step 1's launch


def test_the_host_calls_bound_a_prefill_step_from_below():
    from simserve.cost import GpuCostModel
    from simserve.cost.gpu import BatchShape
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
    c = host.host_calls["piecewise"]
    loop_s = (c["schedule_us"] + c["update_us"] + c["launch_us_per_layer"] * m.num_layers) * 1e-6
    assert with_calls.step_s(small) == pytest.approx(max(loop_s, without.step_s(small)))
    assert with_calls.step_s(small) > without.step_s(small)   # host-bound: the short workload
    decode = BatchShape(num_tokens=40, prefill_chunks=np.zeros(0, dtype=np.int64),
                        prefill_ctx=np.zeros(0, dtype=np.int64), num_decodes=40,
                        decode_ctx_sum=int(d.sum()), num_sample_rows=40, decode_ctx=d)
    assert with_calls.step_s(decode) == without.step_s(decode)   # decode steps unchanged
    sync = GpuCostModel(m, prof, table_tokens=8192,
                        host=dataclasses.replace(host, async_scheduling=False))
    nosync = GpuCostModel(m, prof, table_tokens=8192, host=dataclasses.replace(
        host, async_scheduling=False, host_calls=None))
    assert sync.step_s(small) == nosync.step_s(small)   # only the async loop is bounded
