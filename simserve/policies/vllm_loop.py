"""vLLM's asynchronous engine-core loop (`EngineCore.step_with_batch_queue`): a host clock
next to the GPU's, for engines whose host calls were measured (`host_calls` in the GPU
profile's engine entry, all three graph modes).

One loop iteration, starting at host time H, schedules step m (S), prepares and launches it
(`execute_model`, L), then blocks until step m-1's output is back and processes it
(`update_from_output`, U); only then are m-1's tokens sent:

    GPU start(m) = max(GPU end(m-1), H + S(m))
    out(m-1)     = max(GPU end(m-1), H + S(m) + L(m)) + U(m),   then H = out(m-1)

and with nothing in flight H = H + S(m) + L(m). L depends on how the step runs: a decode-only
batch replays one full CUDA graph, a mixed batch within the capture sizes piecewise graphs,
a larger one runs eager. A request is scheduled only if it reached the engine core before H
(after a decode-only step: before that step's start, as a leap prices it).

Decode-only steps keep the runtime's pricing (back to back, their tokens out when they end,
as a leap prices them): with a full graph's short launch the loop is GPU-bound there. What
the loop adds is at steps with prefill chunks: their GPU start waits for the host, and the
previous step's tokens wait for their launch (`shift`). A decode-only step leaves H at its
start plus U (the previous output sent once the GPU finished it).

Approximations: the previous step's tokens were already handed to the front end at their GPU
end; a delayed token reaches its client at the later of the loop's send plus the front end's
least delay (`lag`: its fixed output work and hand-off) and that delivery (the front end's
queue is not re-run), and a closed-loop client's reaction to a finish
(`on_finish`) keeps the undelayed time. A step with prefill chunks sends no earlier than
the step before it (`applied`).
"""
from __future__ import annotations

MODES = ("full", "piecewise", "eager")


def loop_calls(host) -> dict | None:
    """The host calls (µs) by graph mode when `host` measured all three, else None."""
    calls = getattr(host, "host_calls", None)
    if host is None or not host.async_scheduling or not calls or any(m not in calls for m in MODES):
        return None
    return {m: (float(calls[m]["schedule_us"]) * 1e-6, float(calls[m]["update_us"]) * 1e-6,
                float(calls[m]["launch_us_per_layer"]) * 1e-6) for m in MODES}


class EngineLoop:
    """One engine's host clock `H` and the token record of its last step (whose delivery a
    following step with prefill chunks may still delay)."""

    def __init__(self, table, calls: dict, graph_max: int, num_layers: int, lag: float = 0.0):
        self.table = table
        self.lag = lag   # the front end's least delay from a send to the client (s)
        self.graph_max = graph_max
        # mode -> (S, U, L) in seconds
        self.calls = {m: (s, u, lay * num_layers) for m, (s, u, lay) in calls.items()}
        self.H = 0.0
        # the admission cut-off of the next step: H, except after a decode-only step, whose
        # start it is (the leaper's rule for a leap's steps; the output's update time left out)
        self.cut = 0.0
        self.last: tuple | None = None   # (ids, GPU end) of the last step's tokens
        self.sent: float | None = None   # when the step before the one pricing now sent

    def mode(self, shape) -> str:
        if not len(shape.prefill_chunks):
            return "full"
        return "piecewise" if shape.num_tokens <= self.graph_max else "eager"

    def idle(self, now: float) -> None:
        """The engine had nothing to run: the last output was sent, the loop waits."""
        self.last = None
        self.table.retire_hold = None
        self.H = self.cut = max(self.H, now)

    def decode_start(self, clock: float) -> float:
        """When the next step's GPU work may start if it decodes only (a leap's start too)."""
        return max(clock, self.H + self.calls["full"][0])

    def decoded(self, start: float) -> None:
        """A decode-only step (or a leap's last) began at `start`: the previous output was
        sent once the GPU finished it."""
        self.H = start + self.calls["full"][1]
        self.cut = start
        self.sent = None

    def applied(self, ids: list, g_end: float) -> None:
        """The step that just ended at `g_end` delivered tokens to `ids`. A step with
        prefill chunks cannot send before the step ahead of it did (the loop sends in order)."""
        if self.sent is not None:
            self.shift(ids, self.sent + self.lag)
        self.last = (ids, g_end)
        # a later prefill step may still delay these tokens: streaming keeps them until then
        self.table.retire_hold = min(ids) if len(ids) else None

    def prefill_step(self, shape, clock: float) -> float:
        """Step with prefill chunks about to run (GPU free at `clock`): its GPU start; the
        last step's tokens are delayed to the loop's send time."""
        S, U, L = self.calls[self.mode(shape)]
        H = self.H
        start = max(clock, H + S)
        if self.last is not None:
            ids, g_end = self.last
            out = max(g_end, H + S + L) + U
            self.shift(ids, out + self.lag)
            self.H = self.sent = out
        else:
            self.H = H + S + L
            self.sent = None
        self.cut = self.H
        return start

    def shift(self, ids: list, to: float) -> None:
        """The last token of each of `ids` reaches its client at the later of `to` and its
        front-end delivery (its first-token and finish times too, where it was one)."""
        t = self.table
        mask = t._mask
        for r in ids:
            if r < t.num_retired:
                continue
            g = int(t.generated[r])
            pos = int(t.offsets[r]) + g - 1
            if mask is not None:
                pos &= mask
            x = t.token_times[pos]
            if x >= to:
                continue
            x = t.token_times[pos] = to
            if g == 1:
                t.first_token[r] = x
            if g >= t.output[r]:
                t.finish[r] = x
