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
