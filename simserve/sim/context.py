"""What a policy gets to build its engines on: one simulation's environment and state."""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np
import simpy

from simserve.sim.clock import at
from simserve.sim.cluster import Cluster
from simserve.sim.requests import RequestTable

if TYPE_CHECKING:  # type-only: the core is handed these specs, it imports nothing above it
    from simserve.hardware.setup import Hardware
    from simserve.models import ModelSpec


class ArrivalSource:
    """Delivers requests to the policy's handler at their arrival times (one event per
    distinct arrival time, never per token). `next_arrival_s` lets engines bound event leaps.

    With `max_concurrency` N the source is a closed-loop client (`vllm bench serve
    --max-concurrency`): a request is sent at its scheduled time or, if N requests are then in
    flight, when one of them finishes, in schedule order. Send times go into `sent_s` (the
    request table's `arrival`, so latencies count from them). The feedback path is `release`:
    the request table calls it with the time of each finish.
    """

    def __init__(self, env: simpy.Environment, arrival_s: np.ndarray,
                 max_concurrency: int | None = None, sent_s: np.ndarray | None = None):
        self.env = env
        self.arrival = arrival_s
        self.n = len(arrival_s)
        self.next_index = 0
        self.handler = None
        self.max_concurrency = max_concurrency
        self.sent = sent_s if sent_s is not None else np.array(arrival_s, dtype=np.float64)
        self.num_in_flight = 0  # sent and not finished (a finish counts from its own time)
        self._slot = None       # event the source waits on while N requests are in flight

    @property
    def next_arrival_s(self) -> float:
        """No request is sent before this time. While the concurrency limit binds, a slot can
        free whenever any engine finishes a request, so the answer is `now` (no leap)."""
        if self.next_index >= self.n:
            return np.inf
        if self.max_concurrency is not None and self.num_in_flight >= self.max_concurrency:
            return float(self.env.now)
        return float(self.arrival[self.next_index])

    def release(self, num: int, t: float) -> None:
        """`num` requests finished at time t (>= now: an engine that leaps records finishes
        ahead of the clock); their slots free at exactly t."""
        ev = at(self.env, max(t, self.env.now))
        ev.callbacks.append(lambda _ev: self._free(num))

    def _free(self, num: int) -> None:
        self.num_in_flight -= num
        if self._slot is not None and not self._slot.triggered:
            self._slot.succeed()

    def run(self):
        if self.max_concurrency is not None:
            yield from self._run_closed()
            return
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

    def _run_closed(self):
        env, arr, n, limit, sent = self.env, self.arrival, self.n, self.max_concurrency, self.sent
        i = 0
        while i < n:
            delay = arr[i] - env.now
            if delay > 0:
                yield env.timeout(delay)
            while self.num_in_flight >= limit:
                self._slot = env.event()
                yield self._slot
                self._slot = None
            now = env.now
            j = i
            while j < n and arr[j] <= now and self.num_in_flight < limit:
                sent[j] = now
                self.num_in_flight += 1
                j += 1
            self.next_index = j
            for rid in range(i, j):
                self.handler(rid)
            i = j


class Recorder:
    """Per-scheduling-event samples (a leap of k decode steps is one sample), held in typed
    arrays (8 bytes a value: a million-request run samples millions of events)."""

    def __init__(self):
        self.t = array("d")
        self._engine = array("l")   # codes into _engines (engine ids as the policy names them)
        self._engines: list = []
        self._code: dict = {}
        self.num_running = array("q")
        self.num_waiting = array("q")
        self.kv_used_blocks = array("q")
        self.tokens_total = array("q")
        self.num_iterations = 0
        self.num_steps_scheduled = 0  # iterations scheduled one by one (the rest were leapt)
        # a `trace_events.TraceEvents` when the run writes a timeline (`--trace-events`);
        # engines test `trace is not None` once per iteration and do nothing else without it
        self.trace = None

    @property
    def engine(self) -> list:
        return [self._engines[c] for c in self._engine]

    def sample(self, t, engine, running, waiting, kv_used, tokens_total):
        code = self._code.get(engine)
        if code is None:
            code = self._code[engine] = len(self._engines)
            self._engines.append(engine)
        self.t.append(t)
        self._engine.append(code)
        self.num_running.append(running)
        self.num_waiting.append(waiting)
        self.kv_used_blocks.append(kv_used)
        self.tokens_total.append(tokens_total)

    def frame(self):
        import pandas as pd
        ints = all(isinstance(e, (int, np.integer)) for e in self._engines)
        names = np.asarray(self._engines + [None], dtype=object)[:-1]
        if ints:
            names = names.astype(np.int64)
        eng = names[np.frombuffer(self._engine, dtype=np.int_)] if len(self._engine) else \
            np.zeros(0, dtype=np.int64 if ints else object)
        return pd.DataFrame({"t_s": np.frombuffer(self.t, dtype=np.float64),
                             "engine": eng,
                             "num_running": np.frombuffer(self.num_running, dtype=np.int64),
                             "num_waiting": np.frombuffer(self.num_waiting, dtype=np.int64),
                             "kv_used_blocks": np.frombuffer(self.kv_used_blocks, dtype=np.int64),
                             "tokens_total": np.frombuffer(self.tokens_total, dtype=np.int64)})


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
