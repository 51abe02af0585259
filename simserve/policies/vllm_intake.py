"""How requests reach a vLLM-family engine's waiting queue and tokens reach clients: the API
server's front end and asynchronous scheduling's cut-offs.

The front end (`simserve.sim.frontend`, vLLM's API server when its host path was measured)
serves admissions and token deliveries on one CPU in time order; a request reaches the engine
core `in_delay_s` after its admission work ends, or, when the profile fits a batching stage
(vLLM's API server tokenises prompts queued together in one call), `in_delay_s` after the
stage releases the batch it was in (with the admission split around the stage, after the
request's own work past the stage, queued again on the front end's CPU). Under async
scheduling vLLM schedules step m while step m-1 runs on the GPU (its batch queue holds two
steps), so a request reaching the engine core after step m-1 started waits for step m+1:
`cutoff` is the latest arrival a step may admit (vllm/v1/engine/core.py `step_with_batch_queue`).
"""
from __future__ import annotations

from collections import deque

from simserve.sim.clock import at

INF = float("inf")


class Intake:
    """One engine's intake. `engine` supplies `arrive(rid)` (a request reaches its waiting
    queue) and `leaper` (whose pending leap an arrival may cut short)."""

    def __init__(self, ctx, engine, frontend, async_scheduling: bool):
        self.ctx, self.engine, self.frontend = ctx, engine, frontend
        self.async_ = async_scheduling
        self.reached: dict[int, float] = {}  # rid -> when it reached the engine (async only)
        self.cutoff = INF
        self.loop = None  # the engine-core loop (`vllm_loop.EngineLoop`) when modelled
        self.prev_start = self.prev_end = -1.0  # the last step's start and end
        self._admitting: deque[float] = deque()  # admission completions not yet reached
        # requests whose admission work is not done (~rid: the work past the stage)
        self._in_frontend: deque[int] = deque()
        self._pre_wait: deque[float] = deque()  # when the requests in `pre_delay_s` reach it
        self._n_pre = 0  # split front end: requests whose work before the stage is queued
        self._held: list[int] = []  # done with it, held for the others (`pre_interleave`)
        self._stage_gen = 0  # the batching stage's current wake-up

    def enqueue(self, rid: int) -> None:
        """The router gives this engine request `rid` now."""
        now, fe, leaper = self.ctx.env.now, self.frontend, self.engine.leaper
        pending = leaper.pending
        if pending is not None and pending.open:
            leaper.arrivals_here += 1
        if fe is None:
            if pending is not None:  # the engine sees it at the end of the step in flight
                leaper.bound(now)
            self.engine.arrive(rid)
            return
        if pending is not None:  # output work ending before it precedes its admission
            leaper.deliver_before(now)
        fe.admit(now, int(self.ctx.table.prompt[rid]))
        self._in_frontend.append(rid)
        if fe.split:
            self._n_pre += 1
        if pending is not None:
            leaper.bound(self.own_next_s())
        if len(self._in_frontend) == 1:  # the front end was idle: its head starts now
            at(self.ctx.env, fe.head_done).callbacks.append(self._front_end_done)

    def _front_end_done(self, _ev) -> None:
        """The front end finished the head's admission work (at its `head_done`, fixed when
        it became the head): the engine sees it `in_delay_s` later; the next one starts."""
        env, fe, q = self.ctx.env, self.frontend, self._in_frontend
        now = env.now
        if self.engine.leaper.pending is not None:  # output work ending before the pop
            self.engine.leaper.deliver_before(now)  # precedes it
        fe.pop(now)
        rid = q.popleft()
        if rid < 0:   # its work past the stage: it leaves the front end
            self._release(~rid, now)
        elif fe.split:
            self._pre_done(rid, now)
        elif fe.stage is not None:
            if fe.stage.put(now, rid, int(self.ctx.table.prompt[rid])):
                self._stage_wake()
        else:
            self._release(rid, now)
        if q:
            at(env, fe.head_done).callbacks.append(self._front_end_done)

    def _release(self, rid: int, now: float) -> None:
        """`rid` leaves the front end at `now`; it reaches the engine `in_delay_s` later."""
        env, fe = self.ctx.env, self.frontend
        t = now + fe.in_delay_s
        if t > now:
            self._admitting.append(t)
            at(env, t).callbacks.append(lambda _ev: self._admitted(rid))
        else:
            self.engine.arrive(rid)

    # -- the batching stage ---------------------------------------------------------------
    def _pre_done(self, rid: int, now: float) -> None:
        """`rid`'s work before the stage ended. With `pre_interleave` the handlers that came in
        together go on together: held until no other's work before the stage is queued (or a
        full batch is held), as an event loop running each handler to its next await does."""
        fe = self.frontend
        self._n_pre -= 1
        if fe.pre_interleave:
            self._held.append(rid)
            if self._n_pre and len(self._held) < fe.stage.max_size:
                return
            rids, self._held = self._held, []
        else:
            rids = [rid]
        for r in rids:
            if fe.pre_delay_s > 0:
                self._pre_delay(r, now + fe.pre_delay_s)
            elif fe.stage.put(now, r, int(self.ctx.table.prompt[r])):
                self._stage_wake()

    def _pre_delay(self, rid: int, t: float) -> None:
        """`rid` reaches the stage at `t`."""
        self._pre_wait.append(t)
        at(self.ctx.env, t).callbacks.append(lambda _ev: self._pre_waited(rid))

    def _pre_waited(self, rid: int) -> None:
        """`rid`'s delay before the stage ended (a constant delay keeps them in order)."""
        self._pre_wait.popleft()
        if self.frontend.stage.put(self.ctx.env.now, rid, int(self.ctx.table.prompt[rid])):
            self._stage_wake()

    def _stage_wake(self) -> None:
        """The stage's next call start moved: wake then (an earlier wake-up goes stale)."""
        self._stage_gen += 1
        g = self._stage_gen
        at(self.ctx.env, self.frontend.stage.start_at).callbacks.append(
            lambda _ev: self._stage_start(g))
        if self.engine.leaper.pending is not None:
            self.engine.leaper.bound(self.own_next_s())

    def _stage_start(self, gen: int) -> None:
        if gen != self._stage_gen:
            return
        end = self.frontend.stage.start(self.ctx.env.now)
        at(self.ctx.env, end).callbacks.append(self._stage_done)

    def _stage_done(self, _ev) -> None:
        """The stage's call ended: its batch leaves together; the next gathering opens."""
        stage, now = self.frontend.stage, self.ctx.env.now
        if self.frontend.split:
            self._post(stage.finish(now), now)
        else:
            for rid in stage.finish(now):
                self._release(rid, now)
        if stage.start_at < INF:
            self._stage_wake()

    def _post(self, batch: list[int], now: float) -> None:
        """The released `batch`'s work past the stage queues on the front end's CPU."""
        fe, q, prompt = self.frontend, self._in_frontend, self.ctx.table.prompt
        leaper = self.engine.leaper
        if leaper.pending is not None:  # output work ending before it precedes it
            leaper.deliver_before(now)
        was_idle = not q
        for rid in batch:
            fe.admit_work(now, fe.post_s + fe.post_tok_s * int(prompt[rid]))
            q.append(~rid)
        if was_idle and q:
            at(self.ctx.env, fe.head_done).callbacks.append(self._front_end_done)
        if leaper.pending is not None:
            leaper.bound(self.own_next_s())

    def _admitted(self, rid: int) -> None:
        """`rid` reaches the engine core, `in_delay_s` after its admission work ended."""
        self._admitting.popleft()  # a constant delay keeps completions in order
        self.engine.arrive(rid)

    def reach(self, rid: int) -> None:
        """`rid` reached the waiting queue now (async scheduling keeps when)."""
        if self.async_:
            self.reached[rid] = self.ctx.env.now

    def num_in_frontend(self) -> int:
        """Requests given to this engine that have not reached its waiting queue yet."""
        stage = self.frontend.stage if self.frontend is not None else None
        return (len(self._in_frontend) + len(self._admitting) + len(self._pre_wait)
                + len(self._held)
                + (len(stage) if stage else 0))

    def own_next_s(self) -> float:
        """The next time a request this engine already took can reach its waiting queue."""
        fe = self.frontend
        nxt = self._admitting[0] if self._admitting else INF
        if fe is not None and fe.stage is not None:   # a lower bound: its next call
            head = fe.head_done if self._in_frontend else INF
            if fe.split:   # the head may be a request's work past the stage
                t_in = min(head, self._pre_wait[0]) if self._pre_wait else head
                return min(nxt, head + fe.in_delay_s,
                           fe.stage.next_release(t_in) + fe.in_delay_s)
            return min(nxt, fe.stage.next_release(head) + fe.in_delay_s)
        if self._in_frontend:
            nxt = min(nxt, fe.head_done + fe.in_delay_s)
        return nxt

    def delivered(self, t: float, n: int) -> float:
        """When the client receives the `n` tokens this engine sampled at `t`."""
        return self.frontend.deliver(t, n) if self.frontend is not None else t

    # -- async scheduling -----------------------------------------------------------------
    def step_cutoff(self, clock: float) -> float:
        """The latest arrival the step starting at `clock` sees: back to back, the step was
        scheduled when the last one began."""
        return self.prev_start if self.prev_end == clock else clock

    def unseen(self, r: int) -> bool:
        """Did `r` reach the engine after this step was scheduled (async scheduling)?"""
        return self.async_ and self.reached.get(r, -1.0) > self.cutoff

    def head_seen(self, head: int, clock: float) -> bool:
        """Will the step starting at `clock` see waiting request `head`?"""
        if not self.async_:
            return True
        cut = self.step_cutoff(clock) if self.loop is None else self.loop.cut
        return self.reached.get(head, -1.0) <= cut

    def waiting_at(self, waiting, t: float) -> int:
        """Requests waiting at t, before the queue's later arrivals."""
        reached = self.reached
        return sum(1 for r in waiting if reached.get(r, -1.0) < t)
