"""The GPU worker (DualPace §4.2, §5): runs GPU-main batches as FIFO stages (pre-layer, N
transformer layers, post-layer) and serves Dense Assist requests of the CPU engine at the
stage boundaries (after the pre-layer, after each layer, before the post-layer) without
preempting a stage. When no main batch runs, a ready assist is served at once.

A main batch is not simulated as N+2 events: it is one timeout, interrupted only when an
assist arrives; the assist then waits for the next boundary, is served, and the rest of the
batch shifts by the service time (`MainRun` keeps the shifts so layer end times stay exact).
In whole-forward mode (C ≤ F, assists unreachable) there are no boundaries at all.

While a main batch runs with nothing else on the PCIe channels, an assist's whole service is
known when it is asked for (`try_serve`): the boundary it waits for, its GPU time and both
transfers are worked out in closed form with the same float operations the events would do, and
the CPU side sleeps until the result is back (one event instead of about ten). Otherwise it goes
through the queue and the events (`submit`).
"""
from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque

import simpy

from simserve.sim.clock import at


class Assist:
    """One Dense Assist call: H2D activations, GPU compute, D2H result (bytes per GPU rank)."""

    __slots__ = ("h2d_bytes", "gpu_s", "d2h_bytes", "done", "kind")

    def __init__(self, env, kind: str, h2d_bytes: float, gpu_s: float, d2h_bytes: float):
        self.kind, self.h2d_bytes, self.gpu_s, self.d2h_bytes = kind, h2d_bytes, gpu_s, d2h_bytes
        self.done = env.event()


def stage_boundary(now: float, start: float, shift: float, pre: float, layer: float,
                   N: int):
    """The first stage boundary at or after `now` of a batch of N layers (`pre`, then `layer`
    each) started at `start` and delayed `shift` by assists (None: in the post-layer)."""
    x = now - start - shift - 1e-12
    if x <= pre:
        return 1
    k = 1 + int(math.ceil((x - pre) / layer)) if layer > 0 else N + 1
    return k if k <= N + 1 else None


def assist_span(now: float, b: float, hg: float, dh: float | None, dd: float | None):
    """(start, end) of an assist asked for at `now` whose boundary comes at `b`: its host and
    GPU work `hg`, then its H2D and D2H transfers (None: none)."""
    t0 = now + (b - now) if b > now else now
    t = t0 + hg
    if dh is not None:
        t = t + dh
    if dd is not None:
        t = t + dd
    return t0, t


class MainRun:
    """Timing of one GPU-main batch: stage k ends at start + E(k) + the assist time inserted
    at boundaries ≤ k (boundary k = after k stages). Stage 0 is the pre-layer, 1..N the layers,
    N+1 the post-layer."""

    __slots__ = ("start", "pre", "layer", "post", "N", "shift", "shifts", "bounds", "cums",
                 "on_start", "pending", "applied", "arm")

    def __init__(self, start, pre, layer, post, N):
        self.start, self.pre, self.layer, self.post, self.N = start, pre, layer, post, N
        self.shift = 0.0
        self.shifts: list[tuple[int, float]] = []   # (boundary, assist time), in time order
        self.bounds: list[int] = []     # their boundaries (nondecreasing)
        self.cums: list[float] = []     # the shift after each
        self.on_start = None
        self.pending = None     # (boundary, since) of an assist service in progress
        self.applied = None     # event the engine triggers once the batch's tokens are applied
        self.arm = start        # when the worker last set its end-of-batch timer

    def expected_end(self) -> float:
        """When the worker's end-of-batch timer fires: armed at `arm` for `end − arm`."""
        a = self.arm     # `end` written out (the same float operations)
        e = self.start + (self.pre + self.N * self.layer + self.post) + self.shift
        return a + max(0.0, e - a)

    def next_boundary(self, now: float):
        """The first stage boundary at or after `now` (None: in the post-layer)."""
        return stage_boundary(now, self.start, self.shift, self.pre, self.layer, self.N)

    def offset(self, k: int) -> float:
        """Unshifted time after k stages."""
        if k <= 0:
            return 0.0
        if k <= self.N + 1:
            return self.pre + (k - 1) * self.layer
        return self.pre + self.N * self.layer + self.post

    def add_shift(self, k: int, d: float) -> None:
        """An assist of `d` seconds served at boundary k: the stages after it wait."""
        self.shift += d
        self.shifts.append((k, d))
        self.bounds.append(k)
        self.cums.append(self.shift)

    def layer_end(self, j: int, now: float) -> float:
        """Absolute end time of transformer layer j (0-based) as known at `now` (a lower
        bound while an assist is being served before it): the assists at boundaries ≤ j + 1
        (a prefix of the shifts, whose running sum is their sum) delay it."""
        i = bisect_right(self.bounds, j + 1)
        t = self.start + (self.pre + (j + 1) * self.layer) + (self.cums[i - 1] if i else 0)
        p = self.pending
        if p is not None and p[0] <= j + 1:
            t += now - p[1]
        return t

    @property
    def end(self) -> float:
        return self.start + (self.pre + self.N * self.layer + self.post) + self.shift   # offset(N + 2)

    @staticmethod
    def fresh_ends(start: float, pre: float, layer: float, post: float, N: int):
        """(`end`, `expected_end()`) of a run started and armed at `start` with no shift yet:
        the same float operations, without the object."""
        end = start + (pre + N * layer + post) + 0.0
        return end, start + max(0.0, end - start)


class GpuWorker:
    def __init__(self, env: simpy.Environment, h2d, d2h, host_s: float, staged: bool,
                 closed_form: bool = True):
        self.env, self.h2d, self.d2h = env, h2d, d2h
        self.host_s = host_s
        self.staged = staged
        self.closed_form = closed_form
        self.chain = closed_form          # `serve_at`: a CPU batch's next assists at once
        self.num_chained = 0              # assists served by `serve_at`
        self.run: MainRun | None = None   # the staged main batch holding the GPU
        self.copies = None                # Prefill-to-CPU copies worked out in closed form
        self.serving = None               # (assist, start) in service on the event path
        self._idle_req = None             # the idle server's claim on the GPU
        self.num_closed_form = 0
        self.queue: deque[Assist] = deque()
        self._arrive = env.event()
        self._lock = simpy.Resource(env, capacity=1)
        self.num_assists = 0
        self.assist_busy_s = 0.0
        self.main_busy_s = 0.0
        self.run_log = None   # list of (start, end) of main batches, when tests ask
        env.process(self._idle_server())

    @property
    def idle(self) -> bool:
        """No batch, no assist queued or in service, both channels free."""
        return (self.run is None and not self.queue and not self._lock.count
                and not self._lock.queue and self.copies is None and self.h2d.idle
                and self.d2h.idle)

    def hold(self):
        """A claim on the GPU (a context manager to yield, as `run_main` holds it)."""
        return self._lock.request()

    def free_at(self):
        """When the GPU is free again if nothing else asks for it or the channels meanwhile:
        now when idle; the end of the assist the idle server is serving, if that is all
        (None otherwise)."""
        if self.idle:
            return self.env.now
        if self.run is not None or self._lock.queue or self.copies is not None:
            return None
        if self.serving is not None and not self.queue:
            a, t0 = self.serving
        elif (self.serving is None and len(self.queue) == 1 and self._idle_req is not None
              and self._lock.users == [self._idle_req]):
            a, t0 = self.queue[0], self.env.now    # the idle server takes it up now
        else:
            return None
        t = t0 + (self.host_s + a.gpu_s)
        if a.h2d_bytes:
            t = t + self.h2d.duration_s(a.h2d_bytes)
        if a.d2h_bytes:
            t = t + self.d2h.duration_s(a.d2h_bytes)
        return t

    # -- assists --------------------------------------------------------------------------
    def try_serve(self, h2d_bytes: float, gpu_s: float, d2h_bytes: float):
        """The time an assist asked for now completes, when the running main batch serves it
        at its next boundary with both channels free; None: `submit` it instead."""
        run, now, cs = self.run, self.env.now, self.copies
        if (run is None or not self.closed_form or self.queue or run.pending is not None
                or now >= run.expected_end() or not (self.h2d.idle and self.d2h.idle)):
            if cs is not None:
                cs.interrupt()               # its copies now share the D2H channel
            return None
        if cs is not None:                   # Prefill-to-CPU copies share the D2H channel
            if cs.run is not run:
                cs.interrupt()
                return None
            sv = cs.serve(now, h2d_bytes, gpu_s, d2h_bytes)
            return None if sv is None else sv[2]
        sv = self.service(run, now, h2d_bytes, gpu_s, d2h_bytes)
        if sv is None:
            return None
        self.book(run, sv, h2d_bytes, d2h_bytes)
        return sv[2]

    def serve_at(self, run: MainRun, at_s: float, h2d_bytes: float, gpu_s: float,
                 d2h_bytes: float):
        """`try_serve` of an assist that the CPU batch will ask for at `at_s` (≥ now), worked
        out now: its completion time, booked; None where `try_serve` at `at_s` would not
        serve it in closed form (nothing is booked then).

        Called only just after this batch's previous assist was served in closed form during
        `run` (so `run` holds the GPU, the queue is empty, nothing is pending and both
        channels are free now). Until `at_s` nothing else can change what `try_serve` reads:
        assists come only from the one CPU batch, which sleeps until `at_s`; the GPU engine
        waits for `run` to end, so it neither starts transfers nor another batch (and only a
        batch start creates Prefill-to-CPU copies, hence `copies is None` is checked now);
        `run` is still the worker's batch at `at_s` iff `at_s < run.expected_end()`, which
        `try_serve` checks too. The only other event in between, the worker's end-of-batch
        timer, re-arms itself from `run` and ends the batch at the same time either way.
        So the same checks and `service` on the same `run` state give the same floats.

        With this batch's Prefill-to-CPU copies in closed form (`CopyStream`), the assist is
        served through them (`CopyStream.serve` at `at_s`) where `try_serve` would do so: their
        loop state changes only in `serve` (the stream's own wake-ups re-project its end from
        that state and change nothing else), so serving at `at_s` now gives the same floats.
        If the copies would all be done by `at_s` (the stream then hands the channel back and
        `try_serve` serves it alone), `serve` finds nothing left to wait for and times it as
        `service` does, booking the copies first as they would have been. Cases where
        `try_serve` would interrupt the copies (the post-layer) are left to it."""
        if (self.queue or run.pending is not None
                or at_s >= run.expected_end() or not (self.h2d.idle and self.d2h.idle)):
            return None
        cs = self.copies
        if cs is not None:
            if (cs.run is not run or cs.end_s is None or cs.cont is not None
                    or run.next_boundary(at_s) is None):
                return None
            sv = cs.serve(at_s, h2d_bytes, gpu_s, d2h_bytes)
            self.num_chained += 1
            return sv[2]
        sv = self.service(run, at_s, h2d_bytes, gpu_s, d2h_bytes)
        if sv is None:
            return None
        self.book(run, sv, h2d_bytes, d2h_bytes)
        self.num_chained += 1
        return sv[2]

    def serve_chain(self, run: MainRun, at_s: float, h2d_bytes: float, gpu_s: float,
                    d2h_bytes: float, then: float, n: int):
        """`serve_at` for up to n assists, the first asked for at `at_s` and each next one
        `then` after the last one's end: (how many were served, when the CPU side of the
        last one is done). Without copies, what `serve_at` checks and does is written out
        on plain floats: the queue, the pending service and the channels do not change
        while it loops, so only the end of `run` is checked again; `MainRun.next_boundary`,
        `offset`, `expected_end` and `GpuWorker.service` with the same operations in the
        same order; the services counted at once (`count_many`). With copies, `serve_at`'s
        checks that `CopyStream.serve` leaves as they were (the queue, the pending service
        (set and cleared within it), the channels (the copies are booked, never held), the
        stream's run, projection and event-driven rest) are made once, and only the end of
        `run` and its boundary at each asking time again."""
        cs = self.copies
        if cs is not None:
            if (self.queue or run.pending is not None or not (self.h2d.idle and self.d2h.idle)
                    or cs.run is not run or cs.end_s is None or cs.cont is not None):
                return 0, at_s
            m = 0
            while m < n and at_s < run.expected_end() and run.next_boundary(at_s) is not None:
                at_s = cs.serve(at_s, h2d_bytes, gpu_s, d2h_bytes)[2] + then
                m += 1
            self.num_chained += m
            return m, at_s
        if self.queue or run.pending is not None or not (self.h2d.idle and self.d2h.idle):
            return 0, at_s
        dh = self.h2d.duration_s(h2d_bytes) if h2d_bytes else None
        dd = self.d2h.duration_s(d2h_bytes) if d2h_bytes else None
        hg = self.host_s + gpu_s
        start, pre, layer, post, N = run.start, run.pre, run.layer, run.post, run.N
        D = pre + N * layer + post
        shift, arm = run.shift, run.arm
        svs = []
        while len(svs) < n:
            if not at_s < arm + max(0.0, (start + D + shift) - arm):   # expected_end
                break
            k = stage_boundary(at_s, start, shift, pre, layer, N)
            if k is None:
                break
            b = start + (pre + (k - 1) * layer) + shift                 # service_head
            t0, t = assist_span(at_s, b, hg, dh, dd)
            svs.append((k, t0, t, dh, dd))
            run.add_shift(k, t - t0)                                     # shift
            shift = run.shift
            run.arm = arm = t
            at_s = t + then
        self.count_many(svs, h2d_bytes, d2h_bytes)
        self.num_chained += len(svs)
        return len(svs), at_s

    def service(self, run: MainRun, now: float, h2d_bytes: float, gpu_s: float,
                d2h_bytes: float):
        """(boundary, start, end, H2D time, D2H time) of an assist arriving at `now` during
        `run` with both channels free, as the events would time it; None in the post-layer."""
        head = self.service_head(run, now, h2d_bytes, gpu_s)
        if head is None:
            return None
        k, t0, t, dh = head
        dd = None
        if d2h_bytes:
            dd = self.d2h.duration_s(d2h_bytes)
            t = t + dd
        return k, t0, t, dh, dd

    def service_head(self, run: MainRun, now: float, h2d_bytes: float, gpu_s: float):
        """(boundary, start, end of the H2D and GPU part, H2D time) of an assist arriving at
        `now` during `run`; None in the post-layer. The D2H part is the caller's (its channel
        may be shared with Prefill-to-CPU copies)."""
        k = run.next_boundary(now)
        if k is None:
            return None
        dh = self.h2d.duration_s(h2d_bytes) if h2d_bytes else None
        t0, t = assist_span(now, run.start + run.offset(k) + run.shift, self.host_s + gpu_s,
                            dh, None)
        return k, t0, t, dh

    def book(self, run: MainRun, sv, h2d_bytes: float, d2h_bytes: float) -> None:
        """A closed-form assist service: counted, and the batch shifted by it."""
        self.count(sv, h2d_bytes, d2h_bytes)
        self.shift(run, sv)

    def count(self, sv, h2d_bytes: float, d2h_bytes: float) -> None:
        _, t0, t, dh, dd = sv
        if dh is not None:   # the H2D part ends before the D2H part (a trace's estimate)
            self.h2d.book(h2d_bytes, dh, t - (dd or 0.0))
        if dd is not None:
            self.d2h.book(d2h_bytes, dd, t)
        self.num_assists += 1
        self.num_closed_form += 1
        self.assist_busy_s += t - t0

    def count_many(self, svs, h2d_bytes: float, d2h_bytes: float) -> None:
        """`count` of each service in `svs`, in order. Without a trace sink, `Channel.book`'s
        updates are written out: the busy-time sums add the same floats in the same order,
        the counters add up as integers (tests check against `count`)."""
        h, d = self.h2d, self.d2h
        if h.trace is not None or d.trace is not None:
            for sv in svs:
                self.count(sv, h2d_bytes, d2h_bytes)
            return
        hb, db, ab = h.busy_s, d.busy_s, self.assist_busy_s
        nh = nd = 0
        for _, t0, t, dh, dd in svs:
            if dh is not None:
                hb += dh
                nh += 1
            if dd is not None:
                db += dd
                nd += 1
            ab += t - t0
        h.busy_s, d.busy_s, self.assist_busy_s = hb, db, ab
        h.num_transfers += nh
        h.bytes_moved += nh * int(h2d_bytes)
        d.num_transfers += nd
        d.bytes_moved += nd * int(d2h_bytes)
        self.num_assists += len(svs)
        self.num_closed_form += len(svs)

    @staticmethod
    def shift(run: MainRun, sv) -> None:
        """The rest of the batch waits for the service; the worker re-arms its timer then."""
        k, t0, t, _, _ = sv
        run.add_shift(k, t - t0)
        run.arm = t

    def submit(self, a: Assist) -> simpy.Event:
        if self.copies is not None:
            self.copies.interrupt()
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
            self.serving = (a, t0)
            yield env.timeout(self.host_s + a.gpu_s)   # launch/finalise + CUDA compute
            if a.h2d_bytes:
                yield from self.h2d.transfer(a.h2d_bytes)
            if a.d2h_bytes:
                yield from self.d2h.transfer(a.d2h_bytes)
            self.serving = None
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
                self._idle_req = req
                yield req
                yield from self._serve_queue()
            self._idle_req = None

    # -- main batches ---------------------------------------------------------------------
    def run_main(self, run: MainRun):
        """A process body: hold the GPU for one main batch, serving assists at boundaries."""
        env = self.env
        with self._lock.request() as req:
            yield req
            run.start = run.arm = env.now
            if run.on_start is not None:
                run.on_start()
            if not self.staged:
                yield at(env, max(run.end, env.now))
            else:
                self.run = run
                while True:
                    if not self.queue:
                        if self._arrive.triggered:
                            self._arrive = env.event()
                        t = at(env, run.expected_end())
                        yield t | self._arrive
                        if t.processed:
                            if env.now < run.expected_end():
                                continue         # a closed-form assist moved the end
                            break
                        if env.now >= run.end:
                            break
                    k = run.next_boundary(env.now)
                    if k is None:        # in the post-layer: served after the batch
                        yield at(env, max(run.end, env.now))
                        break
                    b = run.start + run.offset(k) + run.shift
                    if b > env.now:
                        yield at(env, b)
                    t0 = env.now
                    run.pending = (k, t0)
                    yield from self._serve_queue()
                    run.pending = None
                    run.add_shift(k, env.now - t0)
                    run.arm = env.now
                self.run = None
            self.main_busy_s += (run.end - run.start) - run.shift
            if self.run_log is not None:
                self.run_log.append((run.start, run.end))
