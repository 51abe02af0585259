"""The GPU worker (DualPace §4.2, §5): runs GPU-main batches as FIFO stages (pre-layer, N
transformer layers, post-layer) and serves Dense Assist requests of the CPU engine at the
stage boundaries (after the pre-layer, after each layer, before the post-layer) without
preempting a stage. When no main batch runs, a ready assist is served at once.

A main batch is not simulated as N+2 events: it is one timeout, interrupted only when an
assist arrives; the assist then waits for the next boundary, is served, and the rest of the
batch shifts by the service time (`MainRun` keeps the shifts so layer end times stay exact).
In whole-forward mode (C ≤ F, assists unreachable) there are no boundaries at all.
"""
from __future__ import annotations

import math
from collections import deque

import simpy


class Assist:
    """One Dense Assist call: H2D activations, GPU compute, D2H result (bytes per GPU rank)."""

    __slots__ = ("h2d_bytes", "gpu_s", "d2h_bytes", "done", "kind")

    def __init__(self, env, kind: str, h2d_bytes: float, gpu_s: float, d2h_bytes: float):
        self.kind, self.h2d_bytes, self.gpu_s, self.d2h_bytes = kind, h2d_bytes, gpu_s, d2h_bytes
        self.done = env.event()


class MainRun:
    """Timing of one GPU-main batch: stage k ends at start + E(k) + the assist time inserted
    at boundaries ≤ k (boundary k = after k stages). Stage 0 is the pre-layer, 1..N the layers,
    N+1 the post-layer."""

    __slots__ = ("start", "pre", "layer", "post", "N", "shift", "shifts", "on_start", "pending",
                 "applied")

    def __init__(self, start, pre, layer, post, N):
        self.start, self.pre, self.layer, self.post, self.N = start, pre, layer, post, N
        self.shift = 0.0
        self.shifts: list[tuple[int, float]] = []
        self.on_start = None
        self.pending = None     # (boundary, since) of an assist service in progress
        self.applied = None     # event the engine triggers once the batch's tokens are applied

    def offset(self, k: int) -> float:
        """Unshifted time after k stages."""
        if k <= 0:
            return 0.0
        if k <= self.N + 1:
            return self.pre + (k - 1) * self.layer
        return self.pre + self.N * self.layer + self.post

    def layer_end(self, j: int, now: float) -> float:
        """Absolute end time of transformer layer j (0-based) as known at `now` (a lower
        bound while an assist is being served before it)."""
        k = j + 2
        t = self.start + self.offset(k) + sum(d for b, d in self.shifts if b <= k - 1)
        if self.pending is not None and self.pending[0] <= k - 1:
            t += now - self.pending[1]
        return t

    @property
    def end(self) -> float:
        return self.start + self.offset(self.N + 2) + self.shift


class GpuWorker:
    def __init__(self, env: simpy.Environment, h2d, d2h, host_s: float, staged: bool):
        self.env, self.h2d, self.d2h = env, h2d, d2h
        self.host_s = host_s
        self.staged = staged
        self.queue: deque[Assist] = deque()
        self._arrive = env.event()
        self._lock = simpy.Resource(env, capacity=1)
        self.num_assists = 0
        self.assist_busy_s = 0.0
        self.main_busy_s = 0.0
        self.run_log = None   # list of (start, end) of main batches, when tests ask
        env.process(self._idle_server())

    # -- assists --------------------------------------------------------------------------
    def submit(self, a: Assist) -> simpy.Event:
        self.queue.append(a)
        if not self._arrive.triggered:
            self._arrive.succeed()
        return a.done

    def _serve_queue(self):
        """Serve ready assists FIFO until none is left (called with the GPU held)."""
        env = self.env
        while self.queue:
            a = self.queue.popleft()
            t0 = env.now
            yield env.timeout(self.host_s + a.gpu_s)   # launch/finalise + CUDA compute
            if a.h2d_bytes:
                yield from self.h2d.transfer(a.h2d_bytes)
            if a.d2h_bytes:
                yield from self.d2h.transfer(a.d2h_bytes)
            self.num_assists += 1
            self.assist_busy_s += env.now - t0
            a.done.succeed()

    def _idle_server(self):
        while True:
            if not self.queue:
                if self._arrive.triggered:
                    self._arrive = self.env.event()
                yield self._arrive
                continue
            with self._lock.request() as req:
                yield req
                yield from self._serve_queue()

    # -- main batches ---------------------------------------------------------------------
    def run_main(self, run: MainRun):
        """A process body: hold the GPU for one main batch, serving assists at boundaries."""
        env = self.env
        with self._lock.request() as req:
            yield req
            run.start = env.now
            if run.on_start is not None:
                run.on_start()
            if not self.staged:
                yield env.timeout(run.end - env.now)
            else:
                while True:
                    if not self.queue:
                        if self._arrive.triggered:
                            self._arrive = env.event()
                        t = env.timeout(max(0.0, run.end - env.now))
                        yield t | self._arrive
                        if t.processed or env.now >= run.end:
                            break
                    k = self._next_boundary(run)
                    if k is None:        # in the post-layer: served after the batch
                        yield env.timeout(max(0.0, run.end - env.now))
                        break
                    at = run.start + run.offset(k) + run.shift
                    if at > env.now:
                        yield env.timeout(at - env.now)
                    t0 = env.now
                    run.pending = (k, t0)
                    yield from self._serve_queue()
                    run.pending = None
                    d = env.now - t0
                    run.shift += d
                    run.shifts.append((k, d))
            self.main_busy_s += (run.end - run.start) - run.shift
            if self.run_log is not None:
                self.run_log.append((run.start, run.end))

    def _next_boundary(self, run: MainRun):
        now = self.env.now - run.start - run.shift - 1e-12
        if now <= run.pre:
            return 1
        k = 1 + int(math.ceil((now - run.pre) / run.layer)) if run.layer > 0 else run.N + 1
        return k if k <= run.N + 1 else None
