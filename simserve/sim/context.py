"""What a policy gets to build its engines on: one simulation's environment and state."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np
import simpy

from simserve.sim.cluster import Cluster
from simserve.sim.requests import RequestTable

if TYPE_CHECKING:  # type-only: the core is handed these specs, it imports nothing above it
    from simserve.hardware.setup import Hardware
    from simserve.models import ModelSpec


class ArrivalSource:
    """Delivers requests to the policy's handler at their arrival times (one event per
    distinct arrival time, never per token). `next_arrival_s` lets engines bound event leaps."""

    def __init__(self, env: simpy.Environment, arrival_s: np.ndarray):
        self.env = env
        self.arrival = arrival_s
        self.n = len(arrival_s)
        self.next_index = 0
        self.handler = None

    @property
    def next_arrival_s(self) -> float:
        return float(self.arrival[self.next_index]) if self.next_index < self.n else np.inf

    def run(self):
        env, arr, n = self.env, self.arrival, self.n
        i = 0
        while i < n:
            delay = arr[i] - env.now
            if delay > 0:
                yield env.timeout(delay)
            now = env.now
            j = i
            while j < n and arr[j] <= now:
                j += 1
            self.next_index = j
            for rid in range(i, j):
                self.handler(rid)
            i = j


@dataclass
class Recorder:
    """Per-scheduling-event samples (a leap of k decode steps is one sample)."""

    t: list = field(default_factory=list)
    engine: list = field(default_factory=list)
    num_running: list = field(default_factory=list)
    num_waiting: list = field(default_factory=list)
    kv_used_blocks: list = field(default_factory=list)
    tokens_total: list = field(default_factory=list)
    num_iterations: int = 0
    num_steps_scheduled: int = 0  # iterations scheduled one by one (the rest were leapt)

    def sample(self, t, engine, running, waiting, kv_used, tokens_total):
        self.t.append(t)
        self.engine.append(engine)
        self.num_running.append(running)
        self.num_waiting.append(waiting)
        self.kv_used_blocks.append(kv_used)
        self.tokens_total.append(tokens_total)

    def frame(self):
        import pandas as pd
        return pd.DataFrame({"t_s": self.t, "engine": self.engine, "num_running": self.num_running,
                             "num_waiting": self.num_waiting, "kv_used_blocks": self.kv_used_blocks,
                             "tokens_total": self.tokens_total})


@dataclass
class SimContext:
    env: simpy.Environment
    model: ModelSpec
    hardware: Hardware
    cluster: Cluster
    table: RequestTable
    source: ArrivalSource
    recorder: Recorder
    rng: np.random.Generator
    stats: dict = field(default_factory=dict)
    # wraps each GPU cost model an engine builds (None: use it as is); `simserve validate
    # replay` puts a real executor behind it
    gpu_cost_hook: Callable | None = None
