"""The default router's load counts the requests still in a replica's API-server front end,
so a burst at one instant spreads over the replicas."""
from __future__ import annotations

import collections

import numpy as np

from simserve.hardware.setup import HardwareConfig
from simserve.policies.vllm_engine import ChunkedEngine
from simserve.run import simulate_point
from simserve.workload.spec import Workload


def test_a_same_instant_burst_spreads_over_replicas(monkeypatch):
    given = collections.Counter()
    enqueue = ChunkedEngine.enqueue

    def rec(self, rid):
        given[self.index] += 1
        return enqueue(self, rid)

    monkeypatch.setattr(ChunkedEngine, "enqueue", rec)
    n = 16
    w = Workload(arrival_s=np.zeros(n), prompt_tokens=np.full(n, 500),
                 output_tokens=np.full(n, 8))
    simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h200-sxm", num_gpus=2), "vllm",
                   engine="vllm")
    assert given == {0: n // 2, 1: n // 2}
