"""vLLM's async engine-core loop in the runtime (`policies/vllm_loop.py`): the step before one
with prefill chunks sends its tokens only after that step's launch, the loop only runs under
async scheduling on a profile that measured its host calls."""
from __future__ import annotations

import numpy as np
import pytest

from simserve.hardware.profile import load_profile
from simserve.hardware.setup import HardwareConfig
from simserve.policies import vllm_engine
from simserve.run import simulate_point
from simserve.workload.spec import Workload

# request 0 decodes alone; request 1's prompt arrives mid-run
def _work(prompt: int) -> Workload:
    return Workload(arrival_s=np.array([0.0, 0.3]), prompt_tokens=np.array([200, prompt]),
                    output_tokens=np.array([120, 4]))


W = _work(2000)   # an eager step


def _gaps(loop: bool, monkeypatch, w: Workload = W, **kw) -> np.ndarray:
    if not loop:
        monkeypatch.setattr(vllm_engine, "loop_calls", lambda host: None)
    r = simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"), "vllm", engine="vllm",
                       enable_prefix_caching=False, **kw).records
    return np.diff(r.token_times_s[:int(r.output_tokens[0])])


def _launch_bound_gap(mode: str) -> float:
    """H = the decode step's start + U(full); out = H + S + L + U of `mode` (launch-bound)."""
    calls = load_profile("h200-sxm").overheads["engines"]["vllm-0.22.1"]["host_calls"]
    e, f = calls[mode], calls["full"]
    return (f["update_us"] + e["schedule_us"] + e["launch_us_per_layer"] * 32
            + e["update_us"]) * 1e-6


@pytest.mark.parametrize("leap", [True, False])
def test_the_previous_steps_tokens_wait_for_an_eager_launch(monkeypatch, leap):
    want = _launch_bound_gap("eager")
    with_loop = _gaps(True, monkeypatch, leap=leap)
    assert np.min(np.abs(with_loop - want)) < 0.2e-3
    monkeypatch.undo()
    without = _gaps(False, monkeypatch, leap=leap)
    assert np.min(np.abs(without - want)) > 1e-3
    assert len(with_loop) == len(without)


@pytest.mark.parametrize("prompt, graph_max_tokens, mode", [
    (300, None, "piecewise"), (300, 256, "eager"), (800, None, "eager"),
    (800, 1024, "piecewise")])
def test_the_launch_mode_follows_the_configured_graph_limit(monkeypatch, prompt,
                                                            graph_max_tokens, mode):
    """A prefill runs piecewise within the CUDA-graph limit (the profile's 512 by default,
    else the configured one), eager beyond it: the previous step's tokens wait for that
    launch."""
    kw = {} if graph_max_tokens is None else {"graph_max_tokens": graph_max_tokens}
    gaps = _gaps(True, monkeypatch, _work(prompt), **kw)
    assert np.min(np.abs(gaps - _launch_bound_gap(mode))) < 0.2e-3


def test_without_cuda_graphs_every_step_is_host_timed(monkeypatch):
    """With CUDA graphs off every step runs eager: decode steps too are bound by the eager
    launch (S + L + U of the eager mode per step, above the GPU's decode time)."""
    calls = load_profile("h200-sxm").overheads["engines"]["vllm-0.22.1"]["host_calls"]
    e = calls["eager"]
    loop_s = (e["schedule_us"] + e["launch_us_per_layer"] * 32 + e["update_us"]) * 1e-6
    gaps = _gaps(True, monkeypatch, _work(100), cuda_graphs=False)
    assert np.median(gaps) == pytest.approx(loop_s, rel=0.02)
    monkeypatch.undo()
    plain = _gaps(False, monkeypatch, _work(100), cuda_graphs=False)
    assert np.median(plain) < 0.8 * loop_s


def test_sync_scheduling_has_no_loop(monkeypatch):
    a = _gaps(True, monkeypatch, async_scheduling=False)
    monkeypatch.undo()
    b = _gaps(False, monkeypatch, async_scheduling=False)
    assert np.array_equal(a, b)


def test_streamed_records_equal_the_full_ones_under_the_async_loop():
    """The loop delays a step's tokens until the next step launches: a request finishing in
    that step is not handed to the stream before then (chunks of 16 put boundaries there)."""
    import pandas as pd
    from simserve.hardware.setup import HardwareConfig
    from simserve.metrics import SLO, request_frame
    from simserve.metrics_stream import RecordStream
    from simserve.run import simulate_point
    from simserve.workload.build import build_workload
    w = build_workload("synthetic-conversation", num_requests=600, arrival="poisson", rate=12.0,
                       seed=2, max_context=131072)
    hw = HardwareConfig(gpu="h200-sxm")
    full = simulate_point(w, "llama-3.1-8b", hw, "vllm")
    frames: list = []
    st = RecordStream(SLO(500, 50), frames.append, token_window=1 << 16, chunk=16)
    simulate_point(w, "llama-3.1-8b", hw, "vllm", stream=st)
    got = pd.concat(frames, ignore_index=True)
    want = request_frame(full.records, SLO(500, 50))
    assert got.to_csv(index=False) == want.to_csv(index=False)


class _Table:
    """The request-table members `EngineLoop` touches: one request of 3 tokens, its last one
    at `t_last`."""

    def __init__(self, t_last: float):
        self.num_retired, self._mask, self.retire_hold = 0, None, None
        self.generated, self.offsets = np.array([3]), np.array([0])
        self.output = np.array([3])
        self.token_times = np.array([0.0, 0.0, t_last])
        self.first_token, self.finish = np.array([0.0]), np.array([t_last])
        # the table's memoryviews (generated, num_tokens, offsets, output; first, finish)
        self._views = (memoryview(self.generated), None, memoryview(self.offsets),
                       memoryview(self.output))
        self._first_v, self._finish_v = memoryview(self.first_token), memoryview(self.finish)
        self.released: list = []
        self.on_finish = lambda num, t: self.released.append((num, t))


def _loop(table):
    from simserve.policies import vllm_loop
    calls = load_profile("h200-sxm").overheads["engines"]["vllm-0.22.1"]["host_calls"]
    return vllm_loop.EngineLoop(table, vllm_loop.calls_s(calls), 512, 32)


def _prefill_shape(tokens: int):
    from simserve.cost.gpu import BatchShape
    return BatchShape(num_tokens=tokens, prefill_chunks=np.array([tokens]),
                      prefill_ctx=np.array([0]), num_decodes=0, decode_ctx_sum=0,
                      num_sample_rows=1, decode_ctx=np.zeros(0, dtype=np.int64))


def test_a_closed_loop_slot_frees_when_the_loop_sends_the_last_token():
    """A request finishing in the step before an eager launch reaches its client only after
    that launch: its closed-loop slot frees then, not at the step's GPU end."""
    t = _Table(1.0)
    loop = _loop(t)
    loop.decoded(0.995)
    loop.held()
    t.on_finish(1, 1.0)               # the step's emit reports request 0's finish
    loop.restore()
    loop.applied([0], 1.0)
    assert t.released == []           # held until the next step is priced
    loop.host_step(_prefill_shape(2000), 1.0)
    (num, when), = t.released
    assert num == 1 and when == t.finish[0] == t.token_times[2] > 1.01


def test_a_full_graph_step_releases_finishes_at_their_own_time():
    t = _Table(1.0)
    loop = _loop(t)
    loop.decoded(0.995)
    loop.held()
    t.on_finish(1, 1.0)
    loop.restore()
    loop.applied([0], 1.0)
    loop.decoded(1.0)
    assert t.released == [(1, 1.0)]


@pytest.mark.parametrize("rate", [8.0, 30.0])
def test_a_closed_loop_under_the_engine_loop_leaps_as_it_steps(rate):
    """Held finishes (a leap's too) are released as stepping releases them: identical
    records with and without leaping."""
    from simserve.workload.build import build_workload
    w = build_workload("synthetic-conversation", num_requests=120, arrival="poisson",
                       rate=rate, seed=3, max_context=131072)
    w = Workload(arrival_s=w.arrival_s, prompt_tokens=w.prompt_tokens,
                 output_tokens=w.output_tokens, max_concurrency=8)
    hw = HardwareConfig(gpu="h200-sxm")
    a = simulate_point(w, "llama-3.1-8b", hw, "vllm", engine="vllm").records
    b = simulate_point(w, "llama-3.1-8b", hw, "vllm", engine="vllm", leap=False).records
    assert np.array_equal(a.token_times_s, b.token_times_s)
    assert np.array_equal(a.arrival_s, b.arrival_s)
