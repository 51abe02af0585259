"""Exact event leaping of DualPace's GPU engine over decode-only rounds.

A round whose plan (`gpu_schedule.plan_round`) is "decode every running request, nothing else"
repeats with every context one longer until something changes the plan's inputs: an arrival,
a request finishing, the KV pool running short, or the CPU engine acting (a batch ending or
starting, which moves requests, host blocks and queues). In between, the rounds are worked out
in closed form with the float operations the events would do (`MainRun` stages from the
same cost-model call, the worker's timer arithmetic), and so are the Fused-Assist assists the
CPU engine asks for meanwhile (`GpuWorker.service`, served at the round's stage boundaries),
which shift those rounds. The engine then sleeps until the last round ends and applies the
tokens in one go, and the CPU batch sleeps on to its next assist.

An assist asked for in a round's post-layer is served right after the round, before the next
one starts (planned at the round's end, it starts when the assist is done). After the last
round the CPU batch asks for it itself, as it would: the engine holds the GPU (the worker's
lock) through the leap, so the worker serves it once the leap ends, its transfers sharing the
channels with whatever the next plan moves. A leap may start while the worker serves an
assist (`GpuWorker.free_at`): its first round starts when that one is done. A leap
stops before a round planned at or after the next arrival (unless prompts already wait:
admission stopped at the queue's head, and an arrival joins behind it), or that the CPU
engine's next act (a batch's end, a Split-Final or the final Fused-Assist assist, after which
the CPU engine picks a new batch) does not come strictly after; an idle CPU engine must stay
idle (`CpuEngine.idle_for_good`). The plan's other steps (swap-ins, marks, prefill admission)
find nothing in later rounds when they find nothing now: free HBM only shrinks and nothing
else they read changes. The Prefill-to-CPU copies of a round are never leapt (`copies`).
"""
from __future__ import annotations

import math

import numpy as np

from simserve.policies.dualpace.assist import FUSED
from simserve.policies.dualpace.gpu_worker import MainRun, assist_span, stage_boundary
from simserve.sim.leap import largest_k

LEAP_CAP = 4096   # rounds per leap (bounds the temporary arrays)
SOFT_FIRST = 16   # most rounds priced at first in a leap that serves assists


class Round:
    """One leapt round: its MainRun (start, stages, shifts), its end, the assists served at
    its boundaries, the one served right after it (it came in the post-layer) if any, and
    where the CPU batch stands after it (next act, assists done)."""

    __slots__ = ("run", "end", "served", "after", "next_s", "j", "asks")

    def __init__(self, run, end, served, after, next_s, j, asks):
        self.run, self.end, self.served, self.after = run, end, served, after
        self.next_s, self.j = next_s, j
        self.asks = asks        # (when, assists done) of the CPU batch before `after`


class Leap:
    """Decode-only rounds worked out at once; `end` is when the last one ends. Rounds without
    an assist (`plain`) are kept as three lists (starts, their runs' ends, their ends)."""

    def __init__(self, eng, ids: np.ndarray):
        self.eng, self.ids = eng, ids
        self.rounds: list[Round] = []
        self.plain = None
        # (computed as an array, computed and blocks as lists, Σ blocks, generated) of `ids`
        # at the start
        self.state = None

    @property
    def end(self) -> float:
        return self.plain[2][-1] if self.plain is not None else self.rounds[-1].end

    @property
    def num_rounds(self) -> int:
        return len(self.plain[2]) if self.plain is not None else len(self.rounds)

    def commit(self) -> None:
        """At the start: where the CPU batch stands after the leap (it sleeps on to there).
        When the last round is followed by an assist service, the batch asks for that assist
        itself, on the event path: the worker serves it once the leap hands the GPU back."""
        if self.plain is not None:
            return                              # no assist in it: the batch is not moved
        last = self.rounds[-1]
        if last.j is not None:
            ex = self.eng.cpu.ex
            ex.next_s, ex.j = last.asks if last.after is not None else (last.next_s, last.j)

    def _account(self) -> None:
        """Worker, channels and logs, in the order the rounds would have counted them."""
        eng = self.eng
        w, st, ex = eng.worker, eng.st, eng.cpu.ex
        if self.plain is not None:
            starts, run_ends, ends = self.plain
            busy = w.main_busy_s
            for a, b in zip(starts, run_ends):
                busy += (b - a) - 0.0           # run.end - run.start - run.shift
            w.main_busy_s = busy
            for a, b, e in zip(starts, run_ends, ends):
                if w.run_log is not None:
                    w.run_log.append((a, b))
                if st.log is not None:
                    st.log.append((a, e, "gpu", self.ids.copy()))
            lc = eng.leap_counts
            lc["leaps"] += 1
            lc["rounds"] += len(ends)
            return
        h2d, _, d2h, _ = ex.layer or (0, 0, 0, 0)
        last = self.rounds[-1]
        svs = []                # every assist served, in the order the rounds counted them
        busy = w.main_busy_s
        n_after = 0
        for r in self.rounds:
            svs += r.served
            run = r.run
            busy += (run.end - run.start) - run.shift
            if w.run_log is not None:
                w.run_log.append((run.start, run.end))
            if st.log is not None:
                st.log.append((run.start, r.end, "gpu", self.ids.copy()))
            if r.after is not None and r is not last:
                svs.append(r.after)
                n_after += 1
        w.main_busy_s = busy
        w.count_many(svs, h2d, d2h)
        lc = eng.leap_counts
        lc["leaps"] += 1
        lc["rounds"] += len(self.rounds)
        lc["assists"] += len(svs) - n_after
        lc["assists_after"] += n_after

    def apply(self) -> None:
        """At `end`: accounting, KV, tokens, finished requests (as k rounds of
        `GpuEngine._forward`)."""
        self._account()
        eng = self.eng
        t, ids, bs = eng.ctx.table, self.ids, eng.pool.block_size
        k = self.num_rounds
        # the contexts, blocks and token counts read when the leap was planned: only this
        # engine changes them for the requests it runs, and it slept since
        c, cl, hl, held_sum, gen = self.state
        kb = k + bs - 1
        # max(held, ceil((c + k) / bs)) per request (c ≥ 0), on Python ints
        grown = [h if h >= (x := (ci + kb) // bs) else x for ci, h in zip(cl, hl)]
        eng.pool.allocate(sum(grown) - held_sum)
        t.blocks[ids] = grown
        t.computed[ids] = c + k
        # `emit_many` of the first k - 1 rounds, then `emit` of the last (none is a first token)
        eng.release(t.emit_steps(ids, self.plain[2] if self.plain is not None
                                 else [r.end for r in self.rounds], gen))
        eng.counts["rounds"] += k - 1
        rec = eng.ctx.recorder
        if rec.trace is not None:
            rec.trace.iteration(
                f"GPU engine {eng.index}",
                self.plain[0][0] if self.plain is not None else self.rounds[0].run.start,
                self.end, f"decode x{k}",
                steps=k, prefill_tokens=0, decodes=len(ids), kv_blocks_used=eng.pool.num_used,
                host_kv_blocks_used=eng.st.host_pool.num_used)
        rec.num_iterations += k
        rec.sample(self.end, eng.index, len(eng.running), len(eng.waiting), eng.pool.num_used,
                   t.num_emitted)


def plan_leap(eng, plan) -> Leap | None:
    """The leap starting with this round's `plan`, or None when it must be stepped."""
    t, w, cpu = eng.ctx.table, eng.worker, eng.cpu
    if (plan.victims or plan.swap_in or plan.to_gpu or plan.to_cpu or plan.marks
            or plan.migration_only or eng.copy_done is not None
            or plan.decodes != eng.running):
        return None
    now = eng.ctx.env.now
    free_at = w.free_at()          # the first round starts then (after an assist in service)
    if free_at is None:
        return None
    ex, N = cpu.ex, eng.N
    soft, j = False, None
    if cpu.in_batch:
        a = ex.next_s                         # the CPU batch's next act
        if ex.route_now == FUSED and w.staged and (
                ex.j < N - 1 if a is not None else ex.pending == "post_attention"):
            soft, j = True, ex.j
            h2d, gpu_s, d2h, nxt = ex.layer
            if a is None:                     # it waits for the assist in service
                a = free_at + nxt
        if a is None or not a > now:
            return None
    elif cpu.idle_for_good():
        a = math.inf
    else:
        return None
    if free_at > now and not soft:
        return None
    # what plan_round read this step (plan.decodes == running), as arrays and as lists
    ids, c, held, cl, hl = plan.running
    g = t.generated[ids].tolist()
    bs, free, H = eng.pool.block_size, eng.pool.num_free, sum(hl)
    kmax = min(min([o - x for o, x in zip(t.output[ids].tolist(), g)]), LEAP_CAP)
    kmax = steps_that_fit(kmax, cl, hl, bs, free)
    B = len(ids)
    S0, cmax0 = sum(cl) + B, max(cl) + 1      # Σ (c + 1) and max (c + 1)
    # prompts that wait now wait on: admission stops at the head of the queue, and what it
    # checks only gets tighter; an arrival joins behind it and changes nothing
    arrival = math.inf if eng.waiting else eng.ctx.source.next_arrival_s
    lp = Leap(eng, ids)
    lp.state = (c, cl, hl, H, g)
    s, p = free_at, now    # the next round's start, and when it was planned
    if not soft:
        return _plain(eng, lp, B, S0, cmax0, kmax, s, p, arrival, a)
    return _soft(eng, lp, B, S0, cmax0, kmax, s, p, arrival, a, j, ex.layer)


def steps_that_fit(kmax: int, cl: list[int], hl: list[int], bs: int, free: int) -> int:
    """`largest_k(kmax, fits)` for fits(k): the KV of k more tokens each, Σ max(h, ⌈(c + k) /
    bs⌉) − Σ h blocks, fits in `free` (c: tokens in KV, h: blocks held, per request).

    In closed form: request i takes its m-th new block (m ≥ 1) at k = r_i + (m − 1)·bs with
    r_i = h_i·bs − c_i + 1, so k fits iff fewer than free + 1 of those thresholds are ≤ k: the
    answer is the (free + 1)-th smallest threshold minus 1 (at most kmax, at least 0, as
    `largest_k` returns 0 when nothing fits). When every r_i lies in [1, bs] (h = ⌈c / bs⌉,
    as the engine keeps it) the thresholds of round m of the blocks all come after those of
    round m − 1, so it is sorted(r)[free mod B] + (free div B)·bs. Otherwise `largest_k`
    evaluates fits itself (tests check both against it)."""
    B = len(cl)
    r = [h * bs - c + 1 for c, h in zip(cl, hl)]
    if B and min(r) >= 1 and max(r) <= bs:
        r.sort()
        q, m = divmod(free, B)
        k = r[m] + q * bs - 1
        return kmax if k >= kmax else (k if k > 0 else 0)
    c, held = np.asarray(cl, dtype=np.int64), np.asarray(hl, dtype=np.int64)
    H = sum(hl)
    # KV of k more tokens each: ceil((c + k) / bs) blocks, as (c + k + bs − 1) // bs (c ≥ 0)
    return largest_k(kmax, lambda k: int(np.maximum(held, (c + (k + bs - 1)) // bs).sum())
                     - H <= free)


class _Run:
    """What `Leap._account` and `Leap.apply` read of a leapt round's `MainRun`: its start, its
    end and the assist time inserted into it."""

    __slots__ = ("start", "end", "shift")

    def __init__(self, start, end, shift):
        self.start, self.end, self.shift = start, end, shift


def _soft(eng, lp: Leap, B: int, S0: int, cmax0: int, kmax: int, s: float, p: float,
          arrival: float, a: float, j: int, layer_assist):
    """`plan_leap`'s loop for rounds that serve Fused-Assist assists at their boundaries:
    `MainRun`'s timer arithmetic (`expected_end`, `end`, `next_boundary`, `offset`) and
    `GpuWorker.service` / `GpuWorker.shift` written out on plain floats, with the same
    operations in the same order (no object per round or per assist; tests check)."""
    w, N = eng.worker, eng.N
    h2d, gpu_s, d2h, nxt = layer_assist
    host_s = w.host_s
    hg = host_s + gpu_s
    dh = w.h2d.duration_s(h2d) if h2d else None
    dd = w.d2h.duration_s(d2h) if d2h else None
    pre, _, post = eng._split(0.0, B, B)         # they depend on B alone
    poll = eng.poll_s if w.staged else None
    last = N - 1
    rounds = lp.rounds
    # the rounds' decode times priced a batch at a time (`GpuEngine._decode_run`, the same
    # floats as one call per round): what a stepped round before priced, else as many as a
    # recent leap's rounds would take to the next arrival (any guess gives the same rounds)
    hint = eng._round_hint
    n = int((arrival - s) / hint) + 2 if hint > 0.0 and arrival < math.inf else 8
    n = min(max(n, 4), SOFT_FIRST, kmax)
    d = eng._decode_run(B, S0, cmax0, n)
    for i in range(kmax):
        if i and not p < arrival:
            break
        if i == len(d):                 # the next steps of the run
            d = d + eng._decode_run(B, S0 + B * i, cmax0 + i, min(2 * i, kmax - i))
        total = d[i]
        layer = max(total - pre - post, 0.0) / N      # GpuEngine._split
        if poll is not None:
            layer += poll
        D = pre + N * layer + post
        start = arm = s
        shift = 0.0
        E = arm + max(0.0, (start + D + shift) - arm)          # MainRun.expected_end
        served, after, asks = [], None, None
        while j < last and a < E:             # Fused-Assist assists during this round
            k = stage_boundary(a, start, shift, pre, layer, N)
            if k is None:
                # in the post-layer: the worker waits the batch out, then serves it (with
                # the GPU free, both channels free) before the next round can start
                asks = (a, j)
                E = a + max(0.0, (start + D + shift) - a)
                t1 = E + hg
                t2 = t1 + (dh if h2d else 0.0)
                t3 = t2 + (dd if d2h else 0.0)
                after = (None, E, t3, dh, dd)
                a, j = t3 + nxt, j + 1
                break
            b = start + (pre + (k - 1) * layer) + shift           # GpuWorker.service_head
            t0, t = assist_span(a, b, hg, dh, dd)
            served.append((k, t0, t, dh, dd))
            shift += t - t0                   # GpuWorker.shift
            arm = t
            a, j = t + nxt, j + 1
            E = arm + max(0.0, (start + D + shift) - arm)
        if not a > E:                         # the CPU engine acts during this round
            break
        rounds.append(Round(_Run(start, start + D + shift, shift), E, served, after, a, j,
                            asks))
        p = E
        s = E if after is None else after[2]
    if rounds:
        eng._round_hint = (p - rounds[0].run.start) / len(rounds)
    return lp if lp.rounds else None


def _plain(eng, lp: Leap, B: int, S0: int, cmax0: int, kmax: int, s: float, p: float,
           arrival: float, a: float):
    """`plan_leap`'s loop for rounds that serve no assist (`soft` false): the same float
    operations without an object per round. Each round's split (`GpuEngine._split`: IEEE
    subtractions, a max, a division, the same in numpy as in Python floats) is done for a
    batch of rounds at once, their decode times priced together (`_decode_run`, the same
    floats); only the chain of start and end times (`MainRun.fresh_ends`) is a loop. How
    many rounds to price is guessed from the last leap's round length (any guess gives
    the same rounds)."""
    N = eng.N
    pre, _, post = eng._split(0.0, B, B)         # they depend on B alone
    poll = eng.poll_s if eng.worker.staged else None
    starts, run_ends, ends = [], [], []
    i = 0
    stop = arrival if arrival < a else a
    hint = eng._round_hint
    n = int((stop - s) / hint) + 2 if hint > 0.0 and stop < math.inf else 8
    n = max(n, 4)
    while i < kmax:
        n = min(n, kmax - i)
        layer = np.array(eng._decode_run(B, S0 + B * i, cmax0 + i, n)[:n])
        layer -= pre
        layer -= post
        np.maximum(layer, 0.0, out=layer)
        layer /= N
        if poll is not None:
            layer += poll
        layer *= N
        layer += pre
        layer += post                             # pre + N · layer + post
        for x in layer.tolist():
            if i and not p < arrival:
                break
            end = s + x + 0.0                     # MainRun.fresh_ends
            E = s + max(0.0, end - s)
            if not a > E:                         # the CPU engine acts during this round
                break
            starts.append(s)
            run_ends.append(end)
            ends.append(E)
            p = s = E
            i += 1
        else:
            n *= 2
            continue
        break
    if not ends:
        return None
    eng._round_hint = (ends[-1] - starts[0]) / len(ends)
    lp.plain = (starts, run_ends, ends)
    return lp


def sv_time(ch, nbytes: float) -> float:
    """A transfer's time on a free channel (0 without bytes: no transfer at all)."""
    return ch.duration_s(nbytes) if nbytes else 0.0
