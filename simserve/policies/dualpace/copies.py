"""Prefill-to-CPU KV copies of one GPU-main batch (DualPace §4.1, App. A.1 step 7): layer j's
K/V go D2H over PCIe once layer j has run; the requests become CPU-ready after the last copy
and once the batch's tokens are applied.

Event by event (`_events`), that is a wait for each layer's end and a channel transfer per
layer. In closed form the same loop is stepped as a small state machine (`_advance`: the
copy in hand, waiting for its layer, on the wire, or queued behind an assist, and when that
ends), with the float operations the events would do; the process only sleeps until the last
copy ends. Only an assist can shift a layer or take the channel meanwhile, and the worker
tells the stream about each one (`serve`): the loop is advanced to the assist's boundary,
through its service (its layers' ends are lower bounds until it is done, the assist's D2H
waits for the copy on the wire, copies asked for after it wait for it) and past its end. An
assist the closed form does not cover hands the rest back to events (`interrupt`).
"""
from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from simserve.policies.dualpace.state import CPU, NONE
from simserve.sim.clock import at

CHECK, WAIT, WIRE, QUEUE, DONE = range(5)   # what the copy loop does at its time T


class CopyStream:
    def __init__(self, eng, run, ids: np.ndarray, nbytes_layer: float):
        self.eng, self.run, self.ids, self.nbytes = eng, run, ids, nbytes_layer
        self.env = env = eng.ctx.env
        self.d2h = eng.ctx.cluster.gpus[0].d2h
        self.worker = w = eng.worker
        self.d = self.d2h.duration_s(nbytes_layer)
        self.j, self.phase, self.T = 0, CHECK, env.now   # the copy loop's state
        self.ends: list[float] = []          # copies done in closed form, in order
        self.booked = 0                      # of which counted on the channel
        self.cont = None                     # the event-driven rest after an interrupt
        self.moved = False                   # assists served since `end_s` was projected
        self._projected = None               # (copy ends, j, phase, T) of the loop run to its end
        closed = False
        if w.closed_form:
            w.copies = self                  # assists go through `serve` while copies are on
            closed = self.d2h.idle and not w.queue
        if closed:
            self.end_s = self._projected_end()
            self.proc = env.process(self._closed_form())
        else:
            self.end_s = None
            self.proc = env.process(self._events(0))

    # -- the copy loop in closed form ------------------------------------------------------
    def _advance(self, until: float, inclusive: bool = False, busy_from: float = math.inf,
                 busy_to: float = 0.0) -> None:
        """Step the copy loop through its events before `until` (and at it, if `inclusive`);
        a copy asked for at or after `busy_from` gets the channel at `busy_to`."""
        if self.phase == DONE:              # every copy is on the host: nothing to step
            return
        run, N, d = self.run, self.run.N, self.d
        j, ph, T = self.j, self.phase, self.T
        # `run.layer_end(j, T)` written out (the same float operations): the run does not
        # change while the loop steps
        start, pre, layer, bounds, cums, p = (run.start, run.pre, run.layer, run.bounds,
                                              run.cums, run.pending)
        ends = self.ends
        while ph != DONE and (T < until or (inclusive and T == until)):
            if ph == WIRE:                   # copy j is on the host; the loop checks j + 1
                ends.append(T)
                j += 1
                ph = DONE if j == N else CHECK
            elif ph == QUEUE:                # granted: on the wire from T
                ph, T = WIRE, T + d
            else:                            # CHECK / WAIT: layer j's end as known at T
                i = bisect_right(bounds, j + 1)
                te = start + (pre + (j + 1) * layer) + (cums[i - 1] if i else 0)
                if p is not None and p[0] <= j + 1:
                    te += T - p[1]
                if te > T:
                    ph, T = WAIT, T + (te - T)
                elif T >= busy_from:
                    ph, T = QUEUE, busy_to
                else:
                    ph, T = WIRE, T + d
        self.j, self.phase, self.T = j, ph, T

    def _projected_end(self) -> float:
        """When the last copy ends if no assist comes. The loop run to its end is kept
        (`_projected`): with no assist served since, running it again gives the same."""
        j, ph, T, n = self.j, self.phase, self.T, len(self.ends)
        self._advance(math.inf)
        end = self.ends[-1]
        self._projected = (self.ends[n:], self.j, self.phase, self.T)
        del self.ends[n:]
        self.j, self.phase, self.T = j, ph, T
        return end

    def _book(self, before: float) -> None:
        """Count the copies that ended before `before` on the channel, in order."""
        ends, i = self.ends, self.booked
        if i < len(ends) and ends[i] < before:
            book, nbytes, d = self.d2h.book, self.nbytes, self.d
            while i < len(ends) and ends[i] < before:
                book(nbytes, d, ends[i])
                i += 1
            self.eng.p2c_copy_bytes += (i - self.booked) * int(nbytes)
            self.booked = i

    def serve(self, now: float, h2d_bytes: float, gpu_s: float, d2h_bytes: float):
        """An assist asked for at `now` while the batch runs: its service (as
        `GpuWorker.service`, with the D2H shared with the copies) and the copies around it.
        Returns the service, or None (not covered: the copies go back to events)."""
        if self.end_s is None or self.cont is not None:
            return None
        run, w = self.run, self.worker
        head = w.service_head(run, now, h2d_bytes, gpu_s)
        if head is None:
            self.interrupt()
            return None
        k, t0, t, dh = head
        dd = None
        self._advance(t0, inclusive=True)    # (a layer end at t0 is not the assist's)
        run.pending = (k, t0)
        if d2h_bytes:
            dd = w.d2h.duration_s(d2h_bytes)
            self._advance(t)
            g = self.T if self.phase == WIRE and self.T > t else t   # after the copy on the wire
            t2 = t
            t = g + dd
            self._advance(t, busy_from=t2, busy_to=t)
        else:
            self._advance(t)
        run.pending = None
        self._book(t)
        sv = (k, t0, t, dh, dd)
        w.book(run, sv, h2d_bytes, d2h_bytes)
        self.eng.leap_counts["copy_assists"] += 1
        self.moved = True                    # the copies end later: projected on waking
        return sv

    def _closed_form(self):
        while True:
            yield at(self.env, self.end_s)
            if self.cont is not None:            # interrupted: the events finish the job
                yield self.cont
                return
            if not self.moved:
                break
            self.moved = False                   # assists moved the end: sleep on
            self.end_s = self._projected_end()
            if self.end_s <= self.env.now:
                break
        # no assist since the last projection (`moved` is false): nothing stepped the loop
        # or shifted the run since, so `_advance(math.inf)` would end where it did then
        tail, self.j, self.phase, self.T = self._projected
        self.ends += tail
        self._book(math.inf)
        yield from self._finish()

    def interrupt(self) -> None:
        """An assist is asked for now and not served in closed form: the copies not yet done
        continue as events, from where the loop stands."""
        if self.end_s is None or self.cont is not None:
            return                               # already event by event
        now = self.env.now
        self._advance(now)
        self._book(now + 1.0 if self.phase == DONE else now)
        if self.phase != DONE:
            self.cont = self.env.process(self._resume(self.j, self.phase, self.T))
            self.eng.leap_counts["copy_interrupts"] += 1

    def _resume(self, j: int, phase: int, T: float):
        if phase == WIRE:                        # copy j is on the wire: it keeps the channel
            yield from self.d2h.hold_until(T, self.nbytes, self.d)
            self.eng.p2c_copy_bytes += int(self.nbytes)
            j += 1
        else:                                    # waiting for layer j: wake as it would have
            yield at(self.env, T)
        yield from self._events(j)

    # -- event by event ------------------------------------------------------------------
    def _events(self, j0: int):
        env, run = self.env, self.run
        for j in range(j0, run.N):
            while True:
                te = run.layer_end(j, env.now)
                if te <= env.now:
                    break
                yield at(env, te)
            yield from self.d2h.transfer(self.nbytes)
            self.eng.p2c_copy_bytes += int(self.nbytes)
        yield from self._finish()

    def _finish(self):
        """Once the batch's tokens are applied: the requests are CPU-owned and ready."""
        run, eng = self.run, self.eng
        if self.worker.copies is self:
            self.worker.copies = None
        st, t = eng.st, eng.ctx.table
        if not run.applied.triggered:
            yield run.applied
        ids = self.ids
        fin = ids[t.generated[ids] >= t.output[ids]]
        if len(fin):
            st.host_pool.free(int(st.host_blocks[fin].sum()))
            st.host_blocks[fin] = 0
            st.owner[fin] = NONE
        live = ids[(t.generated[ids] < t.output[ids]) & (t.computed[ids] >= t.prompt[ids])]
        st.owner[live] = CPU
        st.set_ready(live)
