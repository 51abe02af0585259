"""Runtime state of every request of one simulation, as arrays indexed by request id.

Schedulers hold ids in their own queues; the hot fields live here so that a batch's updates
are a few vectorised numpy operations, never a Python loop over tokens.

Token times: by default one array of every token of every request. With `token_window` the
table keeps a ring instead, of the tokens from the oldest request not yet retired on: requests
finished in id order are handed in chunks to `on_retire(start, end)` (which reads them with
`token_slice`) and their slots reused, so memory stays flat however many requests run. The
ring doubles when the requests in flight span more tokens than it holds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from array import array

import numpy as np

from simserve.sim.records import RequestRecords

if TYPE_CHECKING:  # type-only: the core is handed these specs, it imports nothing above it
    from simserve.workload.spec import Workload


SMALL = 48  # up to this many ids per call, loop over plain ints instead of numpy calls
# emit_steps with the counts given: its loop (`emit_runs`) beats its numpy calls up to here
# (the crossover measured for 1 to 30 steps; numpy's fixed per-call cost wins above it)
SMALL_STEPS = 28


_NONE = np.zeros(0, dtype=np.int64)


def _finished(ids: list, generated: list, output: list) -> np.ndarray:
    """The ids whose generated count reached their output length, in order (plain ints: a
    boolean index built from a list costs more than the comparison)."""
    done = [r for r, x, o in zip(ids, generated, output) if x >= o]
    return np.array(done, dtype=np.int64) if done else _NONE


def _emit_one(tt, first, gen, ntok, off, out, il: list, t: float, mask: int) -> list:
    """`_emit_small`'s loop: one token at t for each id in `il` (distinct), into the token
    table `tt` (ring index mask `mask`, -1 without a ring) and the first-token times; returns
    the ids that finished. Memoryviews of the table's arrays; C arrays when compiled
    (requests.pxd)."""
    done = []
    for i in range(len(il)):
        r = il[i]
        x = gen[r]
        tt[(off[r] + x) & mask] = t
        if x == 0:
            first[r] = t
        x += 1
        gen[r] = x
        ntok[r] += 1
        if x >= out[r]:
            done.append(r)
    return done


def _write_runs(tt, src, gen, ntok, off, out, il: list, generated: list, steps: list,
                groups: dict) -> None:
    """`emit_runs`' loop without a ring: id il[i] gets the first steps[i] times of `src` after
    its generated[i] tokens; the ids that finish go to groups[their steps]. Memoryviews of
    the table's arrays; C arrays when compiled (requests.pxd)."""
    for i in range(len(il)):
        r = il[i]
        x = generated[i]
        n = steps[i]
        a = off[r] + x
        tt[a:a + n] = src[:n]
        x += n
        gen[r] = x
        ntok[r] += n
        if x >= out[r]:
            if n in groups:
                groups[n].append(r)
            else:
                groups[n] = [r]


class RequestTable:
    def __init__(self, w: Workload, token_window: int | None = None, retire_chunk: int = 8192):
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
        total = int(self.offsets[-1])
        self._mask = None  # ring index mask when streaming, else None
        if token_window is not None and token_window < total:
            cap = 1 << max(12, int(token_window - 1).bit_length())
            self._mask = cap - 1
            total = cap
        self.token_times = np.full(total, np.nan)
        self.token_on_cpu = None  # per-token residency, allocated by CPU-tier engines
        # prompt block content hashes (Mooncake hash_ids) for prefix caching; None: no reuse
        self.hash_ids = w.hash_ids
        # the trace's extra per-request columns (`Workload.attrs`: name -> array by request id)
        self.attrs = w.attrs
        self.hash_block_tokens = w.hash_block_tokens
        # the int arrays are never reallocated: views for per-element access in Python loops
        self._views = (memoryview(self.generated), memoryview(self.num_tokens),
                       memoryview(self.offsets), memoryview(self.output))
        self._finish_v = memoryview(self.finish)  # (never reallocated either)
        self._first_v = memoryview(self.first_token)
        self.num_finished = 0
        self.num_emitted = 0
        self.on_finish = None  # on_finish(num, t): requests finished at t (closed-loop clients)
        self.on_retire = None  # on_retire(start, end): requests [start, end) done (streaming)
        self.retire_chunk = retire_chunk
        self.num_retired = 0   # requests before this id were retired (their tokens are gone)
        # an engine that may still move the last token of requests from this id on (vLLM's
        # async loop delays a step's tokens until the next step is launched) holds them back:
        # their ids (a list or an id array; the smallest bounds retiring, found only then)
        self.retire_hold = None
        self._done_prefix = 0  # every request before this id has finished
        self._top = 0          # token offset past the last token written so far

    @property
    def streaming(self) -> bool:
        return self._mask is not None

    def _room(self, ids: np.ndarray, k: int = 1) -> None:
        """Grow the ring until it holds every token from the oldest unretired request to the
        last of ids' next k tokens."""
        self._room_upto(int((self.offsets[ids] + self.generated[ids]).max()) + k)

    def _room_upto(self, top: int) -> None:
        """Grow the ring until it holds every token from the oldest unretired request to
        token offset `top` (exclusive)."""
        if top > self._top:
            self._top = top
        base = int(self.offsets[self.num_retired])
        cap = self._mask + 1
        if top - base <= cap:
            return
        while top - base > cap:
            cap *= 2
        idx = np.arange(base, self._top)
        old_mask, self._mask = self._mask, cap - 1
        tt = np.full(cap, np.nan)
        tt[idx & self._mask] = self.token_times[idx & old_mask]
        self.token_times = tt
        if self.token_on_cpu is not None:
            oc = np.zeros(cap, dtype=bool)
            oc[idx & self._mask] = self.token_on_cpu[idx & old_mask]
            self.token_on_cpu = oc

    def token_slice(self, start: int, end: int) -> np.ndarray:
        """Token times of requests [start, end) (a copy when streaming)."""
        a, b = int(self.offsets[start]), int(self.offsets[end])
        if self._mask is None:
            return self.token_times[a:b]
        return self.token_times[np.arange(a, b) & self._mask]

    def cpu_slice(self, start: int, end: int) -> np.ndarray | None:
        if self.token_on_cpu is None:
            return None
        a, b = int(self.offsets[start]), int(self.offsets[end])
        if self._mask is None:
            return self.token_on_cpu[a:b]
        return self.token_on_cpu[np.arange(a, b) & self._mask]

    def _finished_upto(self) -> None:
        i, fin, n = self._done_prefix, self.finish, self.n
        while i < n and fin[i] == fin[i]:  # not NaN
            i += 1
        self._done_prefix = i
        hold = self.retire_hold
        if hold is not None and len(hold):
            h = int(min(hold))
            if h < i:
                i = h
        if i - self.num_retired >= self.retire_chunk:
            self.retire(i)

    def retire(self, end: int | None = None) -> None:
        """Hand requests [num_retired, end) (default: every finished one) to `on_retire`."""
        end = self._done_prefix if end is None else end
        if end > self.num_retired and self.on_retire is not None:
            self.on_retire(self.num_retired, end)
        self.num_retired = max(self.num_retired, end)

    def track_cpu_tokens(self) -> None:
        """Start recording which tokens a CPU engine decodes (`emit(..., on_cpu=True)`)."""
        if self.token_on_cpu is None:
            self.token_on_cpu = np.zeros(len(self.token_times), dtype=bool)  # ring-sized too

    def emit(self, ids, t: float, on_cpu: bool = False) -> np.ndarray:
        """One token sampled at time t for each id (an array, or a list); returns the ids
        that finished."""
        if len(ids) <= SMALL and not on_cpu and len(ids):  # numpy calls cost more here
            return self._emit_small(ids if type(ids) is list else ids.tolist(), float(t))
        if type(ids) is list:
            ids = np.array(ids, dtype=np.int64)
        g = self.generated[ids]
        pos = self.offsets[ids] + g
        if self._mask is not None:
            if len(ids):
                self._room(ids)
            pos &= self._mask
        self.token_times[pos] = t
        if on_cpu:
            self.token_on_cpu[pos] = True
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
            if self._mask is not None:
                self._finished_upto()
        return done

    def _emit_small(self, il: list[int], t: float) -> np.ndarray:
        """`emit` for a few distinct ids, one Python loop over memoryviews of the int arrays
        (each numpy call on a handful of elements costs more than the loop)."""
        gen, ntok, off, out = self._views
        mask = self._mask
        if mask is not None:  # the ring: grow it to hold them first
            self._room_upto(max([off[r] + gen[r] for r in il]) + 1)
            mask = self._mask
        done = _emit_one(memoryview(self.token_times), self._first_v, gen, ntok, off, out, il,
                         t, -1 if mask is None else mask)
        self.num_emitted += len(il)
        if done:
            self._finished_at(done, t)
            return np.array(done, dtype=np.int64)
        return _NONE

    def emit_many(self, ids: np.ndarray, times: np.ndarray, on_cpu: bool = False) -> None:
        """len(times) tokens for each id (a leap of decode steps); none may finish early."""
        k = len(times)
        pos = (self.offsets[ids] + self.generated[ids])[:, None] + np.arange(k)[None, :]
        if self._mask is not None:
            if len(ids):
                self._room(ids, k)
            pos &= self._mask
        self.token_times[pos] = times[None, :]
        if on_cpu:
            self.token_on_cpu[pos] = True
        self.generated[ids] += k
        self.num_emitted += k * len(ids)
        self.num_tokens[ids] += k

    def emit_steps(self, ids, times, generated: list[int] | None = None) -> np.ndarray:
        """len(times) consecutive tokens for each id (an array, or a list) (a leap of k
        decode steps: `emit_many` of the first k - 1, then `emit` of the last); `generated`:
        the ids' counts before, when the caller has them (none may be 0: no first tokens).
        Returns the ids that finished."""
        if generated is not None and len(ids) <= SMALL_STEPS:
            return self._emit_steps_small(ids, times, generated)
        if type(ids) is list:
            ids = np.array(ids, dtype=np.int64)
        if self._mask is not None:  # a streaming table: the ring-aware general path
            times = np.asarray(times, dtype=np.float64)
            if len(times) > 1:
                self.emit_many(ids, times[:-1])
            return self.emit(ids, float(times[-1]))
        k = len(times)
        times = np.asarray(times, dtype=np.float64)
        if generated is None:
            g = self.generated[ids]
            first = ids[g == 0]
            if len(first):
                self.first_token[first] = times[0]
            tt = self.token_times
            if len(ids) <= SMALL:  # each request's tokens are one contiguous slice
                for o, x in zip(self.offsets[ids].tolist(), g.tolist()):
                    tt[o + x:o + x + k] = times
            else:
                tt[(self.offsets[ids] + g)[:, None] + np.arange(k)] = times
            g = g + k
            self.generated[ids] = g
            done = ids[g >= self.output[ids]]
        else:
            self.token_times[(self.offsets[ids] + generated)[:, None] + np.arange(k)] = times
            g = [x + k for x in generated]
            self.generated[ids] = g
            done = _finished(ids.tolist(), g, self.output[ids].tolist())
        self.num_tokens[ids] += k
        self.num_emitted += k * len(ids)
        return self._finished_at(done, float(times[-1]))

    def _emit_steps_small(self, ids, times, generated: list[int]) -> np.ndarray:
        """`emit_steps` for a few requests: `emit_runs` with every request taking all steps."""
        k = len(times)
        done = self.emit_runs(ids, times, generated, [k] * len(generated)).get(k)
        return np.array(done, dtype=np.int64) if done else _NONE

    def emit_runs(self, ids, times, generated: list[int], steps: list[int]
                  ) -> dict[int, list[int]]:
        """Tokens of a leap that goes through finishes: id i (distinct ids, an array or a
        list) gets the first steps[i] of the consecutive steps ending at `times` (its count
        before: generated[i], never 0). Finishes are recorded at their own step's time,
        earliest first; returns {steps: the ids (a list) that finished after that many
        steps}, in increasing steps. Each request's tokens are one slice of the token table
        (of the ring, split where it wraps), written through a memoryview (a numpy slice
        assignment costs twice as much); counts are updated in the same loop over the int
        arrays' memoryviews (numpy calls on a few elements cost more)."""
        tl = times if type(times) is list else times.tolist()
        src = memoryview(array("d", tl))
        il = ids if type(ids) is list else ids.tolist()
        gen, ntok, off, out = self._views
        mask = self._mask
        groups: dict[int, list] = {}
        if mask is None:
            _write_runs(memoryview(self.token_times), src, gen, ntok, off, out, il,
                        generated if type(generated) is list else list(generated),
                        steps if type(steps) is list else list(steps), groups)
        else:
            starts = [off[r] + x for r, x in zip(il, generated)]
            self._room_upto(max(a + n for a, n in zip(starts, steps)))
            mask = self._mask
            cap = mask + 1
            tt = memoryview(self.token_times)
            for o, n in zip(starts, steps):
                a = o & mask
                if a + n <= cap:
                    tt[a:a + n] = src[:n]
                else:
                    tt[a:] = src[:cap - a]
                    tt[:a + n - cap] = src[cap - a:n]
            for r, x, n in zip(il, generated, steps):
                x += n
                gen[r] = x
                ntok[r] += n
                if x >= out[r]:
                    groups.setdefault(n, []).append(r)
        self.num_emitted += sum(steps)
        if len(groups) <= 1:  # none or one step count: nothing to sort
            for n, done in groups.items():
                self._finished_at(done, tl[n - 1])
            return groups
        return {n: self._finished_at(groups[n], tl[n - 1]) for n in sorted(groups)}

    def _finished_at(self, done, t: float):
        """Record that `done` (an id array, or a list: written one by one) finished at t."""
        if len(done):
            if type(done) is list:
                fin = self._finish_v
                for r in done:
                    fin[r] = t
            else:
                self.finish[done] = t
            self.num_finished += len(done)
            if self.on_finish is not None:
                self.on_finish(len(done), t)
            if self._mask is not None:
                self._finished_upto()
        return done

    def records(self) -> RequestRecords:
        if self._mask is not None:
            raise RuntimeError("a streaming request table hands its records to on_retire")
        return RequestRecords(
            arrival_s=self.arrival, prompt_tokens=self.prompt, output_tokens=self.output,
            first_token_s=self.first_token, finish_s=self.finish, token_offsets=self.offsets,
            token_times_s=self.token_times, num_preemptions=self.preemptions,
            token_on_cpu=self.token_on_cpu, scheduled_s=self.scheduled,
        )
