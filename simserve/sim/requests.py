"""Runtime state of every request of one simulation, as arrays indexed by request id.

Schedulers hold ids in their own queues; the hot fields live here so that a batch's updates
are a few vectorised numpy operations, never a Python loop over tokens.
"""
from __future__ import annotations

import numpy as np

from simserve.sim.records import RequestRecords
from simserve.workload.spec import Workload


class RequestTable:
    def __init__(self, w: Workload):
        n = w.num_requests
        self.n = n
        # when the workload schedules each request, and when it reaches the server (the
        # client's send time: later under a closed loop, see ArrivalSource); latencies count
        # from `arrival`
        self.scheduled = np.array(w.arrival_s, dtype=np.float64)
        self.arrival = self.scheduled.copy()
        self.prompt = np.asarray(w.prompt_tokens, dtype=np.int64)
        self.output = np.asarray(w.output_tokens, dtype=np.int64)
        if n and (self.prompt.min() < 1 or self.output.min() < 1):
            raise ValueError("every request needs at least one prompt and one output token")
        # tokens known to the engine (prompt + sampled outputs) and tokens with KV computed
        self.num_tokens = self.prompt.copy()
        self.computed = np.zeros(n, dtype=np.int64)
        self.generated = np.zeros(n, dtype=np.int64)
        self.blocks = np.zeros(n, dtype=np.int64)          # GPU KV blocks held
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.output, out=self.offsets[1:])
        self.token_times = np.full(int(self.offsets[-1]), np.nan)
        self.token_on_cpu = None  # per-token residency, allocated by CPU-tier engines
        self.num_finished = 0
        self.num_emitted = 0
        self.on_finish = None  # on_finish(num, t): requests finished at t (closed-loop clients)

    def track_cpu_tokens(self) -> None:
        """Start recording which tokens a CPU engine decodes (`emit(..., on_cpu=True)`)."""
        if self.token_on_cpu is None:
            self.token_on_cpu = np.zeros(len(self.token_times), dtype=bool)

    def emit(self, ids: np.ndarray, t: float, on_cpu: bool = False) -> np.ndarray:
        """One token sampled at time t for each id; returns the ids that finished."""
        g = self.generated[ids]
        self.token_times[self.offsets[ids] + g] = t
        if on_cpu:
            self.token_on_cpu[self.offsets[ids] + g] = True
        first = ids[g == 0]
        if len(first):
            self.first_token[first] = t
        self.num_emitted += len(ids)
        g += 1
        self.generated[ids] = g
        self.num_tokens[ids] += 1
        done = ids[g >= self.output[ids]]
        if len(done):
            self.finish[done] = t
            self.num_finished += len(done)
            if self.on_finish is not None:
                self.on_finish(len(done), t)
        return done

    def emit_many(self, ids: np.ndarray, times: np.ndarray, on_cpu: bool = False) -> None:
        """len(times) tokens for each id (a leap of decode steps); none may finish early."""
        k = len(times)
        pos = (self.offsets[ids] + self.generated[ids])[:, None] + np.arange(k)[None, :]
        self.token_times[pos] = times[None, :]
        if on_cpu:
            self.token_on_cpu[pos] = True
        self.generated[ids] += k
        self.num_emitted += k * len(ids)
        self.num_tokens[ids] += k

    def records(self) -> RequestRecords:
        return RequestRecords(
            arrival_s=self.arrival, prompt_tokens=self.prompt, output_tokens=self.output,
            first_token_s=self.first_token, finish_s=self.finish, token_offsets=self.offsets,
            token_times_s=self.token_times, num_preemptions=self.preemptions,
            token_on_cpu=self.token_on_cpu, scheduled_s=self.scheduled,
        )
