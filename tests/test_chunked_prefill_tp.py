"""`chunked` (ConfluxServe's Chunked Prefill baseline): an alias of `vllm`, with SRPT order."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.errors import ConfigError
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.policies.queues import SrptQueue
from simserve.sim.requests import RequestTable
from simserve.run import simulate_point
from tests.helpers import H100, assert_every_token_in_order, requests, workload

H100X4 = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))


def test_srpt_queue_pops_the_fewest_remaining_prefill_tokens_first():
    t = RequestTable(workload([0, 0, 0, 0, 0], [500, 20, 300, 20, 7000], [1] * 5))
    t.computed[2] = 250          # a preempted-then-requeued request would have computed = 0;
    q = SrptQueue(t)             # here: 50 tokens remain, which is what counts
    for rid in (0, 1, 2, 3, 4):
        q.append(rid)
    assert q[0] == 1 and len(q) == 5
    # remaining 500, 20, 50, 20, 7000 -> 1, 3 (tie: lower id first), 2, 0, 4
    assert [q.popleft() for _ in range(5)] == [1, 3, 2, 0, 4]
    assert not q


@pytest.mark.parametrize("scheduler,order", [("fcfs", [0, 1, 2]), ("srpt", [2, 1, 0])])
def test_waiting_prompts_are_admitted_in_srpt_order(scheduler, order):
    # request 0 (8000 tokens) fills the 512-token budget for 16 steps; 1 (4000) and 2 (100)
    # arrive during its first step. FCFS: they wait behind it. SRPT: the budget goes to the
    # fewest remaining prompt tokens, running or waiting: 2, then 1, then the rest of 0
    w = workload([0.0, 0.001, 0.002], [8000, 4000, 100], [2, 2, 2])
    res = simulate_point(w, "llama-3.1-8b", H100, "chunked", tp=1, scheduler=scheduler,
                         max_num_batched_tokens=512)
    assert list(np.argsort(res.records.first_token_s)) == order


def test_fcfs_chunked_is_vllm_at_tp4():
    rng = np.random.default_rng(1)
    n = 60
    w = workload(np.sort(rng.uniform(0, 10, n)), rng.integers(10, 6000, n), rng.integers(1, 80, n))
    a = simulate_point(w, "llama-3.1-8b", H100X4, "chunked")
    b = simulate_point(w, "llama-3.1-8b", H100X4, "vllm", tp=4, vllm_version="0.15.1")
    assert np.array_equal(a.records.token_times_s, b.records.token_times_s)
    assert a.stats["engines"][0]["gpus"] == [0, 1, 2, 3]


def test_bad_scheduler_names_the_field():
    with pytest.raises(ConfigError, match="scheduler"):
        simulate_point(workload([0.0], [10], [2]), "llama-3.1-8b", H100, "chunked",
                       scheduler="edf")


@st.composite
def scenarios(draw):
    w, prompt, output, need = draw(requests(25, 3000, 150, 0.3))
    return w, dict(
        num_gpu_blocks_override=draw(st.integers(need, 3 * need)),
        max_num_batched_tokens=draw(st.sampled_from([64, 512, 2048])),
        max_num_seqs=draw(st.sampled_from([2, 64])), scheduler="srpt", tp=1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_srpt_finishes_everything_within_the_pool_and_leaps_exactly(sc):
    w, params = sc
    res = simulate_point(w, "llama-3.1-8b", H100, "chunked", **params)
    assert res.stats["peak_kv_blocks"][0] <= params["num_gpu_blocks_override"]
    assert res.stats["kv_blocks_in_use_at_end"] == [0]
    rec = res.records
    assert_every_token_in_order(rec, w)
    stepped = simulate_point(w, "llama-3.1-8b", H100, "chunked", leap=False, **params)
    assert np.array_equal(rec.token_times_s, stepped.records.token_times_s)
