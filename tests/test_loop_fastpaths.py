"""The hot loop's fast paths compute the very floats of the general paths they replace."""
from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.cost import GpuCostModel
from simserve.cost.host import engine_host
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.sim.leap import decode_ends

_HW = {g: resolve_hardware(HardwareConfig(gpu=g)) for g in ("h100-sxm", "h200-sxm", "rtx4090")}
_COSTS = {}


def _cost(gpu: str, graphs: bool, scheduling: str | None = None) -> GpuCostModel:
    """The GPU's cost model; with `scheduling` ("sync" or "async"), under vLLM's measured host
    path (async overlaps the host work with the forward: `GpuCostModel.overlap`)."""
    key = (gpu, graphs, scheduling)
    if key not in _COSTS:
        hw = _HW[gpu]
        host = None
        if scheduling is not None:
            host = dataclasses.replace(engine_host(hw.gpu, "vllm"),
                                       async_scheduling=scheduling == "async")
        _COSTS[key] = GpuCostModel(get_model("llama-3.1-8b"), hw.gpu, 1, hw.nvlink,
                                   cuda_graphs=graphs, table_tokens=2048, host=host)
    return _COSTS[key]


@settings(max_examples=300, deadline=None)
@given(gpu=st.sampled_from(sorted(_HW)), graphs=st.booleans(), B=st.integers(1, 600),
       mean=st.integers(0, 40000), spread=st.integers(0, 30000), k=st.integers(1, 300))
def test_decode_steps_match_the_array_call_bit_for_bit(gpu, graphs, B, mean, spread, k):
    cost = _cost(gpu, graphs)
    s0 = B * mean + (spread % B if B > 1 else 0)
    m0 = -(-s0 // B) + (spread if B > 1 else 0)  # the longest context, ≥ the mean
    j = np.arange(k, dtype=np.int64)
    ref = np.atleast_1d(cost.decode_only_s(B, s0 + B * j, m0 + j))
    got = cost.decode_steps_s(B, s0, m0, k)
    assert got.tobytes() == np.asarray(ref, dtype=np.float64).tobytes()
    # and each one is what one step computes with plain numbers
    for i in {0, k // 2, k - 1}:
        one = cost.decode_only_s(B, int(s0 + B * i), int(m0 + i))
        assert float(one) == float(got[i]) and type(one) is float


@settings(max_examples=200, deadline=None)
@given(gpu=st.sampled_from(sorted(_HW)), x=st.integers(1, 4096),
       y=st.floats(0.0, 3e5, allow_nan=False))
def test_grid_at_matches_call(gpu, x, y):
    g = _HW[gpu].gpu.ops("llama-3.1-8b", 1).decode_attn.grid
    assert g.at(x, y) == float(g(x, y))


@settings(max_examples=100, deadline=None)
@given(c=st.lists(st.integers(0, 20000), min_size=1, max_size=40), k=st.integers(1, 200),
       clock=st.floats(0.0, 1e4))
def test_decode_ends_are_stepped_clocks(c, k, clock):
    cost = _cost("h200-sxm", True)
    c = np.asarray(c, dtype=np.int64)
    ends = decode_ends(cost, clock, c, k)
    t = clock
    for i in range(k):
        t += cost.decode_only_s(len(c), int((c + 1 + i).sum()), int(c.max()) + 1 + i)
        assert ends[i] == t


@settings(max_examples=300, deadline=None)
@given(gpu=st.sampled_from(sorted(_HW)), graphs=st.booleans(), B=st.integers(1, 600),
       mean=st.integers(0, 40000), spread=st.integers(0, 30000), k=st.integers(1, 300),
       scheduling=st.sampled_from([None, "sync", "async"]))
def test_decode_steps_list_matches_the_array_path(gpu, graphs, B, mean, spread, k, scheduling):
    cost = _cost(gpu, graphs, scheduling)
    s0 = B * mean + (spread % B if B > 1 else 0)
    m0 = -(-s0 // B) + (spread if B > 1 else 0)
    got = cost.decode_steps_list(B, s0, m0, k)
    assert all(type(x) is float for x in got)
    assert np.array(got).tobytes() == cost.decode_steps_s(B, s0, m0, k).tobytes()


@settings(max_examples=200, deadline=None)
@given(gpu=st.sampled_from(sorted(_HW)), graphs=st.booleans(), B=st.integers(1, 300),
       mean=st.integers(0, 20000), spread=st.integers(0, 10000), k=st.integers(1, 120),
       scheduling=st.sampled_from([None, "sync", "async"]))
def test_decode_steps_are_the_reference_steps_whatever_form_it_picks(gpu, graphs, B, mean,
                                                                      spread, k, scheduling):
    # the one function callers use against its oracle, one decode_only_s per step
    cost = _cost(gpu, graphs, scheduling)
    s0 = B * mean + (spread % B if B > 1 else 0)
    m0 = -(-s0 // B) + (spread if B > 1 else 0)
    got = cost.decode_steps(B, s0, m0, k)
    assert got == [cost.decode_only_s(B, s0 + B * j, m0 + j) for j in range(k)]


@settings(max_examples=200, deadline=None)
@given(gpu=st.sampled_from(sorted(_HW)), c=st.lists(st.integers(0, 20000), min_size=1, max_size=40),
       kmax=st.integers(1, 600), clock=st.floats(0.0, 1e4), gap=st.floats(0.0, 20.0),
       hint=st.sampled_from([0.0, 1e-4, 0.01, 0.05, 1.0]))
def test_leap_ends_are_decode_ends_cut_at_the_arrival(gpu, c, kmax, clock, gap, hint):
    """Whatever the step-duration guess, the leap's end times are decode_ends' floats, cut
    where steps_before cuts them."""
    from simserve.sim.leap import leap_ends, steps_before
    cost = _cost(gpu, True)
    c = np.asarray(c, dtype=np.int64)
    arrival = clock + gap if gap < 19.0 else float("inf")
    ref = decode_ends(cost, clock, c, kmax)
    k = steps_before(ref, kmax, arrival)
    got = leap_ends(cost, clock, len(c), int(c.sum()) + len(c), int(c.max()) + 1, kmax,
                    arrival, hint)
    assert np.array(got).tobytes() == ref[:k].tobytes()
