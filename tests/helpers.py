"""Small builders shared by the simulator tests."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.workload.spec import Workload

H100 = resolve_hardware(HardwareConfig(gpu="h100-sxm"))
H100X4 = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
H200 = resolve_hardware(HardwareConfig(gpu="h200-sxm"))


def workload(arrival, prompt, output) -> Workload:
    return Workload(np.asarray(arrival, dtype=np.float64), np.asarray(prompt, dtype=np.int64),
                    np.asarray(output, dtype=np.int64), name="test")


@st.composite
def requests(draw, max_n: int, max_prompt: int, max_output: int, max_gap: float = 0.3):
    """Random small workloads for property tests: (workload, prompts, outputs, KV blocks of
    16 tokens that the largest request needs)."""
    n = draw(st.integers(1, max_n))
    prompt = draw(st.lists(st.integers(1, max_prompt), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, max_output), min_size=n, max_size=n))
    arrival = np.cumsum(draw(st.lists(st.floats(0.0, max_gap), min_size=n, max_size=n)))
    need = max(-(-(p + o) // 16) for p, o in zip(prompt, output))
    return workload(arrival, prompt, output), prompt, output, need


@st.composite
def conflux_scenarios(draw):
    """Random small ConfluxServe runs: (workload, policy parameters) with tight KV pools, so
    growth does not always fit and leaps are cut where the KV stops fitting."""
    w, _, _, need = draw(requests(14, 6000, 400, 0.25))
    need = int(need / 0.95) + 2
    return w, dict(num_gpu_blocks_override=draw(st.integers(need, need * 2)),
                   scheduler=draw(st.sampled_from(["slo", "fcfs"])),
                   tbt_ms=draw(st.sampled_from([50.0, 100.0, 400.0])))


def run_conflux(w: Workload, **params):
    """ConfluxServe over Llama-3.1-8B on 4x H100 (the property tests' deployment)."""
    from simserve.run import simulate_point
    return simulate_point(w, "llama-3.1-8b", H100X4, "conflux", **params)


# short prompts placed together outgrow their ranks' pools while they decode: leaps stop where
# the KV stops fitting, then decodes are preempted
CONFLUX_PREEMPTING = (workload(np.zeros(12), np.full(12, 100), np.full(12, 2000)),
                      dict(num_gpu_blocks_override=300, headroom=0.0, scheduler="slo",
                           tbt_ms=100.0))


def assert_every_token_in_order(records, w: Workload) -> None:
    """Every request got all its tokens, none missing, strictly after it arrived, in order."""
    for i in range(w.num_requests):
        tt = records.token_times(i)
        assert len(tt) == w.output_tokens[i] and not np.isnan(tt).any()
        assert np.all(np.diff(tt) > 0) and tt[0] > w.arrival_s[i]


def assert_run_complete(res, w: Workload, pool_blocks: int) -> None:
    """Every request finished with all its tokens in order, no pool ever held more than
    `pool_blocks` KV blocks, and every pool is empty at the end."""
    assert res.stats["num_finished"] == w.num_requests
    assert max(res.stats["peak_kv_blocks"]) <= pool_blocks
    assert all(u == 0 for u in res.stats["kv_blocks_in_use_at_end"])
    assert_every_token_in_order(res.records, w)
