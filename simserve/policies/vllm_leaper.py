"""Event leaping for a vLLM-family engine: k decode-only steps priced at once and applied
when the engine wakes at their end, with the same state and token times as k single steps.

Between interesting events (a request reaching this engine, a request finishing, a KV
shortfall) a decode-only engine repeats one step with contexts one longer. A leap stops at the
first step ending at or after the next time one of this engine's own requests reaches its
queue (`bound` moves that earlier when a new one arrives; under async scheduling one step
later, the step already scheduled when it arrived: `_go_past`), where KV runs out and where
the scheduler's `leap_bound` says the batch changes. While nobody waits it runs on through
finishes (segments of `vllm_leap`; the router sees a finish from its time, `ChunkedEngine.
load`), else it stops at the first. It is priced up to the next arrival anywhere and extended
past it when the router sends that arrival elsewhere, so replicas do not stop for each
other's arrivals (docs/architecture.md, Event leaping). With vLLM's front end, the output work
of the steps that ended before a front-end event (an admission submitted or completed) is
submitted just before it (`deliver_before`): the front end serves work in time order, and
stepping would have submitted it by then.
"""
from __future__ import annotations

import bisect

import numpy as np
import simpy

from simserve.policies.vllm_leap import (PendingLeap, Segments, advance_steps, decoding,
                                         new_blocks, new_blocks_upto)
from simserve.policies.vllm_scheduler import LEAP_CAP
from simserve.sim.clock import at
from simserve.sim.leap import largest_k, leap_ends

INF = float("inf")


class Leaper:
    """The engine's pending leap (`pending`, None when none) and how it is priced, bounded
    and committed."""

    def __init__(self, engine):
        self.engine = engine
        self.pending: PendingLeap | None = None  # a leap priced but not yet committed
        self.step_hint = 0.0  # a recent decode step's duration (sizes a leap's pricing)
        # arrivals that came to this engine / went elsewhere while a leap waited for them:
        # once most go elsewhere, leaps are priced to their own bounds at once (`_price`)
        self.arrivals_here = self.arrivals_elsewhere = 0
        # the requests the last committed leap's last step ran (kept for the engine loop)
        self.last_ids: list = []
        self.last_time = 0.0   # when their tokens of that step were delivered

    def _state(self, e):
        """(contexts, outputs so far, room, most steps, most new blocks) of a running batch
        that may leap, else None; room = tokens each request's held KV blocks still fit.
        The batch must be all decoding, for as long as the scheduler's `leap_bound` says."""
        running = e.running
        if not running or len(running) > e.budget:
            return None
        kv = e.kv
        comp, blocks, ntok, gen, _ = kv.views  # plain ints: numpy calls cost more
        batch = decoding(comp, blocks, ntok, gen, running, kv.pool.block_size)
        if batch is None:
            return None  # a prefill (or recompute) is in flight
        c, g, room = batch
        bound = e.scheduler.leap_bound(e, room)
        if bound is None:
            return None
        return c, g, room, bound[0], bound[1]

    def start(self) -> bool:
        """Price the decode-only batch's next k >= 1 steps at once (False: it cannot leap)
        and keep them pending; `wait` commits them at their end."""
        e = self.engine
        st = self._state(e)
        if st is None:
            return False
        c, g, room, most, cap = st
        t, bs = e.table, e.kv.pool.block_size
        out = e.kv.views[4]
        r = [out[i] - x for i, x in zip(e.running, g)]
        first = min(r)
        B = len(c)
        if e.waiting or t.on_finish is not None or most < LEAP_CAP:
            # a finish could admit the head, or a client reacts to it: stop there
            kmax = largest_k(min(first, most), lambda k: new_blocks(room, k, bs) <= cap)
            segs = None
        else:  # blocks freed by finishes are not counted: the bound only errs short
            kmax = largest_k(min(max(r), most), lambda k: new_blocks_upto(room, r, k, bs) <= cap)
            segs = Segments(c, r) if kmax > first else None
        if kmax < 1:
            return False
        ids = np.array(e.running, dtype=np.int64)
        p = PendingLeap(ids, c, g, room, r, e.clock, kmax, e.intake.own_next_s(),
                        sum(c) + B, max(c) + 1, min(first, kmax), segs, sizes=[B])
        if e.intake.async_ and e.ctx.recorder.trace is None:  # (a timeline keeps its leaps)
            p.after = 1
        self._price(p)
        self.pending = p
        return True

    def _price(self, p: PendingLeap) -> None:
        """Price the pending leap up to its own bounds. A new leap is priced only up to the
        first step ending at or after the next arrival anywhere (then `open`), which is where
        a single engine's leap ends; once that arrival went elsewhere, the rest is priced in
        one go (other engines take arrivals: pricing many steps in one call costs less than
        waking at every arrival, and a cut drops the steps it makes unneeded). Once most
        arrivals went elsewhere, new leaps are priced whole, a segment at a time while
        nothing bounds them (then `more`: an arrival may cut them soon). The floats are the
        same however a leap is priced (`leap_ends`)."""
        k = k0 = len(p.ends)
        clock = p.ends[-1] if k else p.clock
        glob = self.engine.ctx.source.next_arrival_s if not k and \
            self.arrivals_elsewhere <= self.arrivals_here else INF
        stop = min(p.own, glob)
        cost, out = self.engine.cost, p.ends
        p.more = False
        while k < p.kmax:
            if k == p.seg_end:  # the current segment's finishes: price the next batch
                if not p.next_segment():
                    break
                if stop == INF and k > k0:  # unbounded: the next batch when this one ends
                    p.more = True
                    break
            s0, B = p.starts[-1], p.sizes[-1]
            j = k - s0
            ends = leap_ends(cost, clock, B, p.seg_sum + B * j, p.seg_max + j,
                             p.seg_end - k, stop, self.step_hint)
            self.step_hint = (ends[-1] - clock) / len(ends)
            out += ends
            k += len(ends)
            clock = ends[-1]
            if clock >= stop:
                if stop == p.own and p.after and not p.reach_step:
                    self._go_past(p, bisect.bisect_left(out, stop) + 1)
                    if p.reach_step:  # price the steps already scheduled then
                        stop = INF
                        continue
                break
        p.open = k < p.kmax and glob < p.own and clock >= glob

    def wait(self):
        """Wait for the pending leap's end, extending it while the arrivals it stopped for
        went to other engines (or while it was priced only to a horizon), then commit it. A
        request reaching this engine meanwhile may shorten it (`bound`, which interrupts
        this wait); front-end events submit the output work of the steps that ended before
        them (`deliver_before`)."""
        e = self.engine
        env = e.ctx.env
        while True:
            p = self.pending
            if p is None:  # committed meanwhile: the engine goes on from its clock
                yield at(env, max(e.clock, env.now))
                return
            try:
                yield at(env, max(p.ends[-1], env.now))
            except simpy.Interrupt:
                continue
            if self.pending is not p:
                continue
            if p.open or p.more:
                if p.open:
                    self.arrivals_elsewhere += 1
                self._price(p)
                if p.ends[-1] > env.now:
                    continue
            self.pending = None
            self._commit(p, len(p.ends))
            return

    def bound(self, own: float) -> None:
        """One of this engine's requests can reach its queue at `own`: the pending leap's
        last step is the first ending at or after it (stepping would see it then)."""
        p = self.pending
        if own >= p.own:
            return
        p.own = own
        k = bisect.bisect_left(p.ends, own) + 1
        if k <= len(p.ends):  # priced past it already
            p.open = p.more = False
            if p.after and not p.reach_step:
                self._go_past(p, k)
                if p.reach_step:
                    k = p.kmax
                    p.more = k > len(p.ends)  # the step past it is still to price
            if k < len(p.ends):
                p.cut(k)
                self.engine.proc.interrupt()  # wake at the new last step

    def _go_past(self, p: PendingLeap, j: int) -> None:
        """Step j of the pending leap is the first to end at or after `p.own`, when one of
        this engine's requests reaches its queue. Under async scheduling the step after it
        was scheduled before the request arrived (`Intake.head_seen`), so stepping decodes it
        with the same batch whatever the request: the leap goes on through it (`p.after`
        steps, at most `kmax`, whose bounds already hold its KV and the waiting head's
        blockage) and records j (`reach_step`), where stepping's engine woke and sampled. An
        exact tie of the arrival with step j's end is left to stepping (the order of the two
        events)."""
        if j < p.kmax and p.ends[j - 1] != p.own:
            p.reach_step = j
            p.kmax = min(p.kmax, j + p.after)
            p.seg_end = min(p.seg_end, p.kmax)

    def deliver_before(self, now: float) -> None:
        """Submit to the front end the output work of the pending steps that ended before
        `now`, ahead of the front-end event at `now` (stepping would have submitted it by
        then); the steps themselves are applied when the leap is committed."""
        p = self.pending
        k, j = bisect.bisect_left(p.ends, now), len(p.delivered)
        if k > j:
            p.delivered += self._deliver_steps(p, j, k)

    def _deliver_steps(self, p: PendingLeap, j: int, k: int) -> list[float]:
        """The front end's delivery times of steps j..k-1, each with its segment's tokens."""
        fe = self.engine.intake.frontend
        if len(p.starts) == 1:
            return fe.deliver_many(p.ends[j:k], p.B)
        out = []
        bounds = p.starts[1:] + [k]
        for s, B in zip(bounds, p.sizes):
            if s > j:
                end = min(s, k)
                out += fe.deliver_many(p.ends[j:end], B)
                j = end
                if j >= k:
                    break
        return out

    def _commit(self, p: PendingLeap, k: int) -> None:
        """Apply the leap's first k steps."""
        e = self.engine
        ends, ids, c, B = p.ends[:k], p.ids, p.c, p.B
        t, bs = e.table, e.kv.pool.block_size
        e.intake.prev_start, e.intake.prev_end = (ends[k - 2] if k > 1 else p.clock), ends[k - 1]
        times = ends
        if e.intake.frontend is not None:
            j = len(p.delivered)
            times = p.delivered[:k] if j >= k else p.delivered + self._deliver_steps(p, j, k)
        if len(p.starts) > 1 or 0 < p.reach_step < k:
            self._commit_segments(p, k, times)
            return
        il = ids if type(ids) is list else ids.tolist()
        if e.loop is not None:
            self.last_ids, self.last_time = il, float(times[k - 1])
        cv, bv = e.kv.views[:2]  # a few requests: element writes beat numpy's fancy indexing
        nb = advance_steps(cv, bv, il, c, p.room, [k] * len(il), k, bs, [])
        if nb:
            e.kv.pool.allocate(nb)
        rec = e.ctx.recorder
        if rec.trace is not None:
            rec.trace.iteration(
                f"engine {e.index}", p.clock, ends[-1], f"decode x{k}", steps=k,
                prefill_tokens=0, prefill_chunks=[], decodes=B,
                kv_blocks_used=e.kv.pool.num_used, waiting=len(e.waiting))
        e.clock = ends[-1]
        hold = e.loop is not None and t.on_finish is not None   # (see EngineLoop.held)
        if hold:
            e.loop.held()
        done = t.emit_steps(il, times, p.g)
        if hold:
            e.loop.restore()
        if len(done):
            e.finish(done)
        rec.num_iterations += k
        e.sample()

    def _commit_segments(self, p: PendingLeap, k: int, times: list) -> None:
        """Apply a leap's first k steps that go through finishes: every request's tokens at
        once, then, segment by segment as stepping would, the KV blocks its steps take, the
        finishes at its end (their blocks freed) and a sample."""
        e = self.engine
        c, room, r = p.c, p.room, p.r
        t, pool, rec = e.table, e.kv.pool, e.ctx.recorder
        bs = pool.block_size
        il = p.ids if type(p.ids) is list else p.ids.tolist()
        cv, bv = e.kv.views[:2]  # a few requests: element writes beat numpy's fancy indexing
        steps = [s if s < k else k for s in r]  # each one's steps
        if e.loop is not None:  # those that ran the last step
            self.last_ids = [i for i, s in zip(il, steps) if s == k]
            self.last_time = float(times[k - 1])
        short = []  # those of the ones finishing before step k
        nk = advance_steps(cv, bv, il, c, room, steps, k, bs, short)  # new blocks after all
        # k steps: `new_blocks_upto(room, r, k, bs)`
        emitted = t.num_emitted  # after the segments so far: + Σ min(steps[i], b) at bound b
        hold = e.loop is not None and t.on_finish is not None   # (see EngineLoop.held)
        if hold:
            e.loop.held()
        done = t.emit_runs(il, times, p.g, steps)
        if hold:
            e.loop.restore()
        bounds = [s for s in p.starts[1:] if s < k] + [k]
        sizes = p.sizes[:len(bounds)]
        j = p.reach_step
        if 0 < j < k and j not in bounds:  # stepping's engine woke at step j: a sample there
            i = bisect.bisect_left(bounds, j)
            bounds.insert(i, j)
            sizes.insert(i, sizes[i])
        short.sort()
        a, held, m, left = 0, 0, 0, len(steps)  # short[:m] (< a) are counted in `emitted`
        for b, B in zip(bounds, sizes):
            nb = nk if b == k else new_blocks_upto(room, steps, b, bs)
            if nb > held:
                pool.allocate(nb - held)
                held = nb
            if rec.trace is not None:
                rec.trace.iteration(
                    f"engine {e.index}", p.ends[a - 1] if a else p.clock, p.ends[b - 1],
                    f"decode x{b - a}", steps=b - a, prefill_tokens=0, prefill_chunks=[],
                    decodes=B, kv_blocks_used=pool.num_used,
                    waiting=len(e.waiting) if b == k else 0)
            e.clock = p.ends[b - 1]
            fin = done.get(b)
            if fin is not None:
                e.finish(fin)
            while m < len(short) and short[m] < b:  # finished in (a, b): its steps only
                emitted += short[m] - a
                left -= 1
                m += 1
            emitted += left * (b - a)
            rec.sample(e.clock, e.index, len(e.running),
                       len(e.waiting) if b == k else
                       e.intake.waiting_at(e.waiting, e.clock) if b == j else 0,
                       pool.num_used, emitted)
            a = b
        rec.num_iterations += k
