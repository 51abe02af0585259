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

A leap stops before a round that starts at or after the next arrival, that an assist would
reach in its post-layer, or that the CPU engine's next act (a batch's end, a Split-Final or
the final Fused-Assist assist, after which the CPU engine picks a new batch) does not come
strictly after; an idle CPU engine must stay idle (`CpuEngine.idle_for_good`). The plan's other
steps (swap-ins, marks, prefills) find nothing in later rounds when they find nothing now:
free HBM only shrinks and nothing else they read changes.
"""
from __future__ import annotations

import math

import numpy as np

from simserve.policies.dualpace.assist import FUSED
from simserve.policies.dualpace.state import GPU, NONE
from simserve.sim.leap import largest_k

LEAP_CAP = 4096   # rounds per leap (bounds the temporary arrays)


class Leap:
    """Decode-only rounds worked out at `start`: their MainRuns with the assists served in
    them; `end` is when the last one ends."""

    def __init__(self, eng, ids: np.ndarray):
        self.eng, self.ids = eng, ids
        self.runs: list = []          # (MainRun, end, [(service, assist)...]) per round
        self.j = None                 # the CPU batch's position after the leap
        self.next_s = None

    @property
    def end(self) -> float:
        return self.runs[-1][1]

    def commit(self) -> None:
        """Account what happened before `end`: worker, channels, the CPU batch's position."""
        eng = self.eng
        w, st, ex = eng.worker, eng.st, eng.cpu.ex
        for run, end, served in self.runs:
            for sv, (h2d, _, d2h) in served:
                w.count(sv, h2d, d2h)
            w.main_busy_s += (run.end - run.start) - run.shift
            if w.run_log is not None:
                w.run_log.append((run.start, run.end))
            if st.log is not None:
                st.log.append((run.start, end, "gpu", self.ids.copy()))
        if self.j is not None:
            ex.j, ex.next_s = self.j, self.next_s

    def apply(self) -> None:
        """At `end`: KV, tokens, finished requests (as k rounds of `GpuEngine._forward`)."""
        eng = self.eng
        st, t, ids, bs = eng.st, eng.ctx.table, self.ids, eng.pool.block_size
        k = len(self.runs)
        c, held = t.computed[ids], t.blocks[ids]
        grown = np.maximum(held, -(-(c + k) // bs))
        eng.pool.allocate(int(grown.sum() - held.sum()))
        t.blocks[ids] = grown
        t.computed[ids] = c + k
        if k > 1:
            t.emit_many(ids, np.array([e for _, e, _ in self.runs[:-1]]))
        done = t.emit(ids, self.end)
        if len(done):
            on_gpu = done[st.owner[done] == GPU]
            eng.pool.free(int(t.blocks[on_gpu].sum()))
            t.blocks[on_gpu] = 0
            st.owner[on_gpu] = NONE
            gone = set(on_gpu.tolist())
            eng.running = [r for r in eng.running if r not in gone]
        eng.counts["rounds"] += k - 1
        rec = eng.ctx.recorder
        rec.num_iterations += k
        rec.sample(self.end, eng.index, len(eng.running), len(eng.waiting), eng.pool.num_used,
                   t.num_emitted)


def plan_leap(eng, plan) -> Leap | None:
    """The leap starting with this round's `plan`, or None when it must be stepped."""
    t, w, cpu = eng.ctx.table, eng.worker, eng.cpu
    if (plan.victims or plan.swap_in or plan.to_gpu or plan.to_cpu or plan.marks
            or plan.migration_only or eng.waiting or eng.copy_done is not None or not w.idle
            or plan.decodes != eng.running):
        return None
    now = eng.ctx.env.now
    ex, N = cpu.ex, eng.N
    soft, nxt = False, None
    if cpu.in_batch:
        a = ex.next_s                         # the CPU batch's next act
        if a is None or not a > now:
            return None
        if ex.route_now == FUSED and ex.j < N - 1 and w.staged:
            soft, j = True, ex.j
            h2d, gpu_s, d2h, nxt = ex.layer
    elif cpu.idle_for_good():
        a = math.inf
    else:
        return None
    ids = np.asarray(eng.running, dtype=np.int64)
    c, held = t.computed[ids], t.blocks[ids]
    bs, free, H = eng.pool.block_size, eng.pool.num_free, int(held.sum())
    kmax = min(int((t.output[ids] - t.generated[ids]).min()), LEAP_CAP)
    kmax = largest_k(kmax, lambda k: int(np.maximum(held, -(-(c + k) // bs)).sum()) - H <= free)
    if kmax < 1:
        return None
    B, S0, cmax0 = len(ids), int((c + 1).sum()), int(c.max()) + 1
    arrival = eng.ctx.source.next_arrival_s
    lp = Leap(eng, ids)
    s = now
    for i in range(kmax):
        if i and not s < arrival:
            break
        run = eng._stages(eng._decode_s(B, S0 + B * i, cmax0 + i), B, B)
        run.start = run.arm = s
        E = run.expected_end()
        served = []
        a_i, j_i = a, (j if soft else None)
        while soft and j_i < N - 1 and a_i < E:   # Fused-Assist assists in this round
            sv = w.service(run, a_i, h2d, gpu_s, d2h)
            if sv is None:                        # in the post-layer: served after it
                return lp if lp.runs else None
            w.shift(run, sv)
            served.append((sv, (h2d, gpu_s, d2h)))
            a_i, j_i = sv[2] + nxt, j_i + 1
            E = run.expected_end()
        if not a_i > E:                           # the CPU engine acts during this round
            break
        lp.runs.append((run, E, served))
        if soft:
            a, j = a_i, j_i
            if served:
                lp.j, lp.next_s = j, a
        s = E
    return lp if lp.runs else None
