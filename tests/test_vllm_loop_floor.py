"""The engine loop's delivery floor (`EngineLoop.floor`): a shift of the last step's tokens to
no later than the time they were all delivered at is skipped. The floor must be a true lower
bound of those tokens' times, and skipping must leave every result as the full shift does."""
from __future__ import annotations

import numpy as np
import pytest

from simserve.hardware.setup import HardwareConfig
from simserve.policies import vllm_loop
from simserve.run import simulate_point
from simserve.workload.spec import Workload


def _work(n: int = 160) -> Workload:
    rng = np.random.default_rng(3)
    return Workload(arrival_s=np.cumsum(rng.exponential(1 / 12.0, n)),
                    prompt_tokens=rng.integers(20, 1500, n),
                    output_tokens=rng.integers(2, 300, n))


def _run(leap: bool, **kw):
    return simulate_point(_work(), "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"), "vllm",
                          engine="vllm", leap=leap, **kw).records


def _last_times(loop, ids) -> list[float]:
    t = loop.table
    il = ids if type(ids) is list else ids.tolist()
    pos = [int(t.offsets[r] + t.generated[r] - 1) for r in il if r >= t.num_retired]
    if t._mask is not None:
        pos = [p & t._mask for p in pos]
    return [float(t.token_times[p]) for p in pos]


@pytest.mark.parametrize("leap", [True, False])
def test_the_floor_bounds_the_tokens_it_skips(monkeypatch, leap):
    real = vllm_loop.EngineLoop.shift
    seen = {"skipped": 0, "shifted": 0}

    def checked(self, ids, to):
        times = _last_times(self, ids)
        if self.floor is not None:
            assert all(x >= self.floor for x in times)   # a lower bound, always
            if self.floor >= to:
                seen["skipped"] += 1
        if any(x < to for x in times):
            seen["shifted"] += 1
        real(self, ids, to)
        assert all(x >= to for x in _last_times(self, ids))

    monkeypatch.setattr(vllm_loop.EngineLoop, "shift", checked)
    _run(leap)
    assert seen["skipped"] > 0 and seen["shifted"] > 0   # both branches ran


@pytest.mark.parametrize("leap", [True, False])
def test_skipping_by_the_floor_changes_no_result(monkeypatch, leap):
    fast = _run(leap)
    real = vllm_loop.EngineLoop.shift

    def unskipped(self, ids, to):
        self.floor = None   # always walk every request
        real(self, ids, to)

    monkeypatch.setattr(vllm_loop.EngineLoop, "shift", unskipped)
    full = _run(leap)
    for a in ("token_times_s", "first_token_s", "finish_s"):
        assert np.array_equal(getattr(fast, a), getattr(full, a), equal_nan=True), a
