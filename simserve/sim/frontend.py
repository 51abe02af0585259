"""A serving engine's front end as one CPU that requests contend for (vLLM's API-server
process: HTTP, tokenisation, output processing, detokenisation and streaming run on one
asyncio event loop).

Two kinds of work share the CPU:
- a request's admission work (`admit`: HTTP, tokenising, handing it to the engine core),
  served first come, first served; the engine sees the request when its work is done
  (`head_done`, then `pop`) plus `in_delay` (hand-offs that hold no CPU);
- each engine step's output work (`deliver`: output processing, detokenising, streaming),
  served ahead of the admissions still queued but after the one in service (the event loop
  runs one task to its next await): measured, during a 600-request burst the streamed first
  tokens left 25 ms after they were sampled while admissions queued for seconds, and the
  streams' P99 ITL doubled at 100-200 small requests/s.
Many small requests or many streams therefore slow admissions: the cap on the admission rate
real servers show. Work must be submitted in nondecreasing time order, which an engine's own
events are (a leap submits only steps that end before the next arrival and the next
admission's completion).

An optional batching stage (`BatchStage`) sits between the admission work and the engine:
a single worker that, once free, takes the first request waiting for it, gathers whatever
else arrives within a window (or until the batch is full), runs one call whose cost is a
fixed part plus a part per prompt token of the whole batch, and releases the batch together
(it holds no front-end CPU: the call runs on a worker thread). Without one, each request
goes on as soon as its own admission work ends.

With a stage, the admission can also be split as the API server's handler is: the work
before the tokenizer (`admit`), a delay that holds no CPU (`pre_delay_s`), the stage, then
each released request's work after it (`post_s + post_tok_s · prompt_tokens`: input
processing, registering the request, the hand-off to the engine core), queued on the same
CPU behind whatever is waiting there (`admit_work`), before `in_delay_s`. The handlers of
concurrent requests then interleave on the CPU instead of each holding it for the whole
admission; with `pre_interleave` the requests whose work before the stage overlapped also
reach the stage together, when the last of them is done (or a full batch is), as an event
loop that runs each handler to its next await interleaves their parts.

Costs are fitted functions from the engine's profile (`simserve.cost.host`); the core only
adds them up.
"""
from __future__ import annotations

from collections import deque


INF = float("inf")


class FrontEnd:
    """Costs in µs: admission `in_us + in_per_token_us · prompt_tokens`, output `out_us +
    out_per_output_us · outputs` per engine step. Delays that hold no CPU (hand-offs between
    the HTTP server, the tokenizer, the engine core's input queue and back) follow the work:
    `in_delay_us` before the engine sees a request, `out_delay_us` before a client sees a
    token; they add latency, not load."""

    def __init__(self, in_us: float, in_per_token_us: float, out_us: float,
                 out_per_output_us: float, in_delay_us: float = 0.0, out_delay_us: float = 0.0,
                 stage: BatchStage | None = None, pre_delay_us: float = 0.0,
                 post_us: float = 0.0, post_per_token_us: float = 0.0,
                 pre_interleave: bool = False):
        self.stage = stage           # the batching stage after admission work, if any
        # the admission split around the stage (all 0: the whole admission before it)
        self.pre_delay_s = pre_delay_us * 1e-6
        self.post_s, self.post_tok_s = post_us * 1e-6, post_per_token_us * 1e-6
        self.split = stage is not None and (pre_delay_us > 0 or post_us > 0
                                            or post_per_token_us > 0 or pre_interleave)
        self.pre_interleave = pre_interleave and self.split
        self.in_s, self.in_tok_s = in_us * 1e-6, in_per_token_us * 1e-6
        self.out_s, self.out_n_s = out_us * 1e-6, out_per_output_us * 1e-6
        self.in_delay_s, self.out_delay_s = in_delay_us * 1e-6, out_delay_us * 1e-6
        self.out_free = 0.0          # when the output work submitted so far is done
        self.pending: deque[float] = deque()   # admission work (s) not done; head in service
        self.head_done = INF         # when the admission in service (the head) completes
        self.busy_s = 0.0

    def admit(self, t: float, prompt_tokens: int) -> None:
        """A request arrives at `t`; its admission work queues behind the earlier ones."""
        self.admit_work(t, self.in_s + self.in_tok_s * prompt_tokens)

    def admit_work(self, t: float, w: float) -> None:
        """`w` seconds of admission work queue at `t` behind the earlier ones."""
        self.busy_s += w
        if not self.pending:
            self.head_done = (t if t > self.out_free else self.out_free) + w
        self.pending.append(w)

    def pop(self, t: float) -> None:
        """The head admission completed at `t` (its `head_done`); the next one starts once the
        output work that came in the meantime is done."""
        self.pending.popleft()
        if self.pending:
            self.head_done = (t if t > self.out_free else self.out_free) + self.pending[0]
        else:
            self.head_done = INF

    def deliver(self, t: float, outputs: int) -> float:
        """One engine step finishing at `t` with `outputs` tokens: when clients receive them."""
        w = self.out_s + self.out_n_s * outputs
        start = t if t > self.out_free else self.out_free
        if self.pending and start < self.head_done:   # the admission in service runs to its end
            start = self.head_done
        self.out_free = start + w
        self.busy_s += w
        return self.out_free + self.out_delay_s

    def deliver_many(self, ends: list[float], outputs: int) -> list[float]:
        """`deliver` for consecutive steps ending at `ends` (nondecreasing), `outputs` tokens
        each, with the same float operations as one `deliver` call per step (event leaping
        must give byte-identical results to stepping)."""
        w = self.out_s + self.out_n_s * outputs
        f, d, busy = self.out_free, self.out_delay_s, self.busy_s
        head = self.head_done if self.pending else float("-inf")   # no admission in service
        out = []
        for e in ends:   # deliver()'s operations, without a call per step
            start = e if e > f else f
            if start < head:
                start = head
            f = start + w
            busy += w
            out.append(f + d)
        self.out_free, self.busy_s = f, busy
        return out


class BatchStage:
    """A batching worker between admission work and the engine. Once free, it takes the first
    request waiting, keeps gathering for `window_us` (starting at once when `max_size` are
    waiting), then runs one call of `call_us + call_per_token_us · tokens of the batch` and
    releases the batch at its end; requests arriving meanwhile wait for the next batch.
    The caller drives it: `put` when a request's admission work ends, `start` at `start_at`,
    `finish` at `end_at`."""

    def __init__(self, window_us: float, max_size: int, call_us: float,
                 call_per_token_us: float):
        if max_size < 1:
            raise ValueError(f"batch stage: max_size must be >= 1, got {max_size}")
        self.window_s, self.max_size = window_us * 1e-6, int(max_size)
        self.call_s, self.call_tok_s = call_us * 1e-6, call_per_token_us * 1e-6
        self.waiting: deque[tuple[int, int]] = deque()   # (request, prompt tokens)
        self.batch: list[int] = []   # the requests in the call running
        self.start_at = INF          # when the gathered batch's call starts (INF: none)
        self.end_at = INF            # when the running call ends (INF: none)
        self.calls: list[tuple[float, int, int]] = []   # (start, size, tokens) per call

    def __len__(self) -> int:
        return len(self.waiting) + len(self.batch)

    def _gather(self, t: float) -> None:
        self.start_at = t if len(self.waiting) >= self.max_size else t + self.window_s

    def put(self, t: float, rid: int, tokens: int) -> bool:
        """Request `rid` waits for the stage from `t`; True when `start_at` moved (a new
        gathering began, or the batch filled up)."""
        self.waiting.append((rid, tokens))
        if self.end_at < INF:             # a call is running: wait for its end
            return False
        if self.start_at == INF:          # the worker was idle: this one opens a batch
            self._gather(t)
            return True
        if len(self.waiting) == self.max_size and self.start_at > t:   # full: start now
            self.start_at = t
            return True
        return False

    def start(self, t: float) -> float:
        """The gathered batch's call starts at `t`; returns when it ends."""
        n = min(len(self.waiting), self.max_size)
        tokens = 0
        for _ in range(n):
            rid, k = self.waiting.popleft()
            self.batch.append(rid)
            tokens += k
        self.calls.append((t, n, tokens))
        self.start_at = INF
        self.end_at = t + self.call_s + self.call_tok_s * tokens
        return self.end_at

    def finish(self, t: float) -> list[int]:
        """The running call ended at `t`: its batch, released; the worker takes the next."""
        out, self.batch, self.end_at = self.batch, [], INF
        if self.waiting:
            self._gather(t)
        return out

    def next_release(self, t_in: float) -> float:
        """A lower bound on the next release when the next request can join at `t_in`: the
        running call's end, else the gathered batch's call at its cheapest, else a call
        opened at `t_in`."""
        if self.end_at < INF:
            return self.end_at
        if self.start_at < INF:
            return self.start_at + self.call_s
        return t_in + self.call_s
