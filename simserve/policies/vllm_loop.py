"""vLLM's asynchronous engine-core loop (`EngineCore.step_with_batch_queue`): a host clock
next to the GPU's, for engines whose host calls were measured (`host_calls` in the GPU
profile's engine entry, all three graph modes).

One loop iteration, starting at host time H, schedules step m (S), prepares and launches it
(`execute_model`, L), then blocks until step m-1's output is back and processes it
(`update_from_output`, U); only then are m-1's tokens sent:

    GPU start(m) = max(GPU end(m-1), H + S(m))
    out(m-1)     = max(GPU end(m-1), H + S(m) + L(m)) + U(m),   then H = out(m-1)

and with nothing in flight H = H + S(m) + L(m). L depends on how the step runs
(`launch_mode`, vLLM's default CUDA-graph mode FULL_AND_PIECEWISE): a decode-only batch of
at most `graph_max` tokens replays one full CUDA graph, a mixed batch that size piecewise
graphs, anything larger (or every step without CUDA graphs, `graph_max` 0) runs eager. A
request is scheduled only if it reached the engine core before H (after a full-graph step:
before that step's start, as a leap prices it).

Full-graph steps keep the runtime's pricing (back to back, their tokens out when they end,
as a leap prices them): with a full graph's short launch the loop is GPU-bound there. What
the loop adds is at the other steps (`host_step`): their GPU start waits for the host, and
the previous step's tokens wait for their launch (`shift`). A full-graph step leaves H at
its start plus U (the previous output sent once the GPU finished it).

A closed-loop client sends its next request when a stream ends, so the finishes of a step
are released (the table's `on_finish`) only once the loop knows when that step's tokens go
out: when the next step is priced (`held`, `release`), at the later of their delivery and
the loop's send.

Approximations: the previous step's tokens were already handed to the front end at their GPU
end; a delayed token reaches its client at the later of the loop's send plus the front end's
least delay (`lag`: its fixed output work and hand-off) and that delivery (the front end's
queue is not re-run). A host-timed step sends no earlier than the step before it
(`applied`).

`realcheck.async_loop` replays this class on the real engine's own steps.
"""
from __future__ import annotations

from typing import Any

MODES = ("full", "piecewise", "eager")


def launch_mode(num_tokens: int, decode_only: bool, graph_max: int) -> str:
    """How vLLM runs a step of `num_tokens` batch tokens: "full" (one CUDA graph: decode
    only), "piecewise" (graphs between eager attention: a batch with prefill chunks) within
    the largest capture size `graph_max`, else "eager" (vLLM's `CudagraphDispatcher`: no
    graph beyond the capture sizes). The runtime's loop and the host-call fit both use it."""
    if num_tokens > graph_max:
        return "eager"
    return "full" if decode_only else "piecewise"


def loop_calls(host) -> dict | None:
    """The host calls by graph mode, {mode: (S, U, L per layer)} in seconds, when `host`
    measured all three under async scheduling, else None."""
    calls = getattr(host, "host_calls", None)
    if host is None or not host.async_scheduling or not calls or any(m not in calls for m in MODES):
        return None
    return calls_s(calls)


def calls_s(calls: dict) -> dict:
    """A profile's `host_calls` ({mode: {schedule_us, update_us, launch_us_per_layer}}) as
    {mode: (S, U, L per layer)} in seconds."""
    return {m: (float(calls[m]["schedule_us"]) * 1e-6, float(calls[m]["update_us"]) * 1e-6,
                float(calls[m]["launch_us_per_layer"]) * 1e-6) for m in MODES}


class EngineLoop:
    """One engine's host clock `H` and the token record of its last step (whose delivery a
    following step with prefill chunks may still delay)."""

    def __init__(self, table, calls: dict, graph_max: int, num_layers: int, lag: float = 0.0):
        self.table = table
        self.lag = lag   # the front end's least delay from a send to the client (s)
        self.graph_max = graph_max   # the largest CUDA-graph capture size (0: no graphs)
        # mode -> (S, U, L) in seconds
        self.calls = {m: (s, u, lay * num_layers) for m, (s, u, lay) in calls.items()}
        self.S_full, self.U_full = self.calls["full"][:2]   # (read on every step)
        self.H = 0.0
        # the admission cut-off of the next step: H, except after a decode-only step, whose
        # start it is (the leaper's rule for a leap's steps; the output's update time left out)
        self.cut = 0.0
        self.last: tuple | None = None   # (ids, GPU end) of the last step's tokens (ids:
        # a list or an id array, read only by `shift`)
        self.sent: float | None = None   # when the step before the one pricing now sent
        # a lower bound on the current time of every last token of `last`'s ids (None:
        # unknown): a shift to no later than it changes nothing and is skipped
        self.floor: float | None = None
        # finishes of the last step not yet released to a closed-loop client: (num, time)
        self.finishes: list = []
        self.finish_to = 0.0     # the earliest those may be released (the loop's send)
        self.on_finish = None    # the table's on_finish while `held` collects

    def held(self):
        """Collect the finishes a step's emit reports instead of releasing them (the table's
        `on_finish` swapped for the emit; call `restore` after it)."""
        t = self.table
        self.on_finish = t.on_finish
        t.on_finish = self._hold
        return self.on_finish

    def restore(self) -> None:
        self.table.on_finish = self.on_finish

    def _hold(self, num: int, t: float) -> None:
        self.finishes.append((num, t))

    def release(self, to: float = 0.0) -> None:
        """Release the held finishes: no earlier than `to` (the loop's send plus `lag`)."""
        fin = self.finishes
        if fin:
            on_finish = self.table.on_finish
            lo = max(to, self.finish_to)
            for num, t in fin:
                on_finish(num, t if t > lo else lo)
            fin.clear()
        self.finish_to = 0.0

    def mode(self, shape) -> str:
        return launch_mode(shape.num_tokens, not len(shape.prefill_chunks), self.graph_max)

    def full(self, shape) -> bool:
        """Does the step replay one full CUDA graph (`mode(shape) == "full"`)?"""
        return shape.num_tokens <= self.graph_max and not len(shape.prefill_chunks)

    def leaps(self, batch: int) -> bool:
        """Can a decode-only batch of `batch` requests leap (its steps replay a full graph)?"""
        return batch <= self.graph_max

    def idle(self, now: float) -> None:
        """The engine had nothing to run until `now`: the last output was sent, the loop
        waits."""
        self.release()
        self.last = None
        self.table.retire_hold = None
        self.H = self.cut = max(self.H, now)

    def decode_start(self, clock: float) -> float:
        """When the next step's GPU work may start if it decodes only (a leap's start too)."""
        s = self.H + self.S_full
        return s if s > clock else clock

    def decoded(self, start: float) -> None:
        """A full-graph step (or a leap's last) began at `start`: the previous output was
        sent once the GPU finished it."""
        if self.finishes:
            self.release()
        else:
            self.finish_to = 0.0
        self.H = start + self.U_full
        self.cut = start
        self.sent = None

    def applied(self, ids, g_end: float, delivered: float | None = None) -> None:
        """The step that just ended at `g_end` delivered tokens to `ids` (a list or an id
        array, not changed afterwards), all at `delivered` where given. A host-timed step
        cannot send before the step ahead of it did (the loop sends in order)."""
        self.floor = delivered
        if self.sent is not None:
            self.shift(ids, self.sent + self.lag)
            self.finish_to = self.sent + self.lag
        self.last = (ids, g_end)
        # a later host-timed step may still delay these tokens: streaming keeps them until then
        self.table.retire_hold = ids

    def leapt(self, start: float, ids: list, g_end: float,
              delivered: float | None = None) -> None:
        """A leap whose last step began at `start` and ended at `g_end`, running `ids` (its
        finishes, held, stay held until the next step is priced), their tokens of that step
        delivered at `delivered` where given."""
        self.floor = delivered
        self.H = start + self.U_full
        self.cut = start
        self.sent = None
        self.last = (ids, g_end)
        self.table.retire_hold = ids

    def host_step(self, shape, clock: float) -> float:
        """A step that is not a full-graph replay (prefill chunks, or beyond the capture
        sizes) about to run (GPU free at `clock`): its GPU start; the last step's tokens are
        delayed to the loop's send time."""
        S, U, L = self.calls[self.mode(shape)]
        H = self.H
        start = max(clock, H + S)
        if self.last is not None:
            ids, g_end = self.last
            out = max(g_end, H + S + L) + U
            self.shift(ids, out + self.lag)
            self.release(out + self.lag)
            self.H = self.sent = out
        else:
            self.release()
            self.H = H + S + L
            self.sent = None
        self.cut = self.H
        return start

    def shift(self, ids, to: float) -> None:
        """The last token of each of `ids` reaches its client at the later of `to` and its
        front-end delivery (its first-token and finish times too, where it was one)."""
        floor = self.floor
        if floor is not None and floor >= to:
            return   # every one is delivered at `to` or later already
        self.floor = to   # (a shift only raises times: afterwards all are at `to` or later)
        t = self.table
        mask = t._mask
        gen, _, off, out = t._views   # memoryviews: plain ints, no numpy scalars per element
        first, fin = t._first_v, t._finish_v
        tt: Any = memoryview(t.token_times)   # (the ring may be reallocated between calls)
        lo = t.num_retired
        for r in (ids if type(ids) is list else ids.tolist()):
            if r < lo:
                continue
            g = gen[r]
            pos = off[r] + g - 1
            if mask is not None:
                pos &= mask
            if tt[pos] >= to:
                continue
            tt[pos] = to
            if g == 1:
                first[r] = to
            if g >= out[r]:
                fin[r] = to
