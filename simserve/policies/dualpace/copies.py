"""Prefill-to-CPU KV copies of one GPU-main batch (DualPace §4.1, App. A.1 step 7): layer j's
K/V go D2H over PCIe once layer j has run; the requests become CPU-ready after the last copy
and once the batch's tokens are applied.

Event by event, that is a timeout to each layer's end and a channel transfer per layer. When
the batch starts with the D2H channel free and no assist about, nothing can shift a layer or
take the channel but an assist, so the whole stream is worked out in closed form (the same
float operations) and the process sleeps until its last copy ends. An assist asked for
meanwhile (`interrupt`, from the GPU worker) hands the copies still to come back to events,
exactly where they would be: the one on the wire keeps the channel until its end, a layer
wait resumes at its wake time.
"""
from __future__ import annotations

import numpy as np

from simserve.policies.dualpace.state import CPU, NONE
from simserve.sim.clock import at


class CopyStream:
    def __init__(self, eng, run, ids: np.ndarray, nbytes_layer: float):
        self.eng, self.run, self.ids, self.nbytes = eng, run, ids, nbytes_layer
        self.env = env = eng.ctx.env
        self.d2h = eng.ctx.cluster.gpus[0].d2h
        self.worker = eng.worker
        self.cont = None                   # the event-driven rest after an interrupt
        self.booked = 0                    # copies counted on the channel so far
        w = self.worker
        self.plan = None
        if w.closed_form:
            w.copies = self                # no assist in closed form while copies are on
            if self.d2h.idle and not w.queue:
                self.plan = self._plan()
        self.proc = env.process(self._closed_form() if self.plan else self._events(0))

    # -- closed form ----------------------------------------------------------------------
    def _plan(self):
        """Per copy: the wake times of its layer wait, its start and its end, as the event
        loop in `_events` computes them with no shifts and a free channel."""
        run, now = self.run, self.env.now
        d = self.d2h.duration_s(self.nbytes)
        out = []
        for j in range(run.N):
            te = run.layer_end(j, now)
            wakes = []
            while te > now:
                now = now + (te - now)
                wakes.append(now)
            start = now
            now = now + d
            out.append((wakes, start, now))
        self.d = d
        return out

    def _book(self, upto: int) -> None:
        for _ in range(self.booked, upto):
            self.d2h.book(self.nbytes, self.d)
            self.eng.p2c_copy_bytes += int(self.nbytes)
        self.booked = max(self.booked, upto)

    def _closed_form(self):
        yield at(self.env, self.plan[-1][2])
        if self.cont is not None:            # interrupted: the events finish the job
            yield self.cont
            return
        self._book(len(self.plan))
        yield from self._finish()

    def interrupt(self) -> None:
        """An assist is asked for now: the copies not yet done continue as events."""
        now, plan = self.env.now, self.plan
        if plan is None or self.cont is not None:
            return                           # already event by event
        j0 = next((j for j, (_, _, end) in enumerate(plan) if end > now), None)
        if j0 is None:                       # all on the host already
            return
        self._book(j0)
        self.cont = self.env.process(self._resume(j0, now))

    def _resume(self, j0: int, now: float):
        wakes, start, end = self.plan[j0]
        if start <= now:                     # copy j0 is on the wire: it keeps the channel
            yield from self.d2h.hold_until(end, self.nbytes, self.d)
            self.eng.p2c_copy_bytes += int(self.nbytes)
            j0 += 1
        else:                                # waiting for layer j0: wake as it would have
            yield at(self.env, next(w for w in wakes if w > now))
        yield from self._events(j0)

    # -- event by event ------------------------------------------------------------------
    def _events(self, j0: int):
        env, run = self.env, self.run
        for j in range(j0, run.N):
            while True:
                te = run.layer_end(j, env.now)
                if te <= env.now:
                    break
                yield env.timeout(te - env.now)
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
