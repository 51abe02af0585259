"""Steps 2–6 of DualPace's GPU engine round (App. A.1) as one function returning a plan;
step 7 (commit and execute) is in `gpu_engine.py`.

2 next-token HBM feasibility: swap-out victims from the eviction tail whose KV the host
  accepts under Eq. 2 (an infeasible tail request is skipped); no victim → the FIFO subset of
  decodes whose growth fits; victims that free only part → a migration-only round;
3 B_migration over the remaining GPU ownership queue (plus deferred swap-in marks), published;
4 all remaining decodes; early swap-in of a ready CPU-waiting prefix when the CPU batch is full,
  its waiting queue non-empty and no swap-out happens (each fits next-token HBM and b̂);
5 FIFO prefills placed by `envelope.admit_prefills` (GPU if its prompt KV fits HBM and Eq. 2
  holds with the longer queue, else CPU; order preserving), then the staging limit;
6 with no swap-out: a second swap-in pass, or, if the CPU waiting queue was empty before step
  4, deferred swap-in marks on CPU-running requests (reserving b̂, not moving ownership).
"""
from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

import numpy as np

from simserve.policies.dualpace.envelope import (admit_prefills, fits, migration_blocks,
                                                 migration_blocks_of)
from simserve.policies.dualpace.state import GPU

MAX_PREFILL_CANDIDATES = 256   # prompts looked at per round (the row limit bounds it anyway)


class Plan:
    """One round's decisions (a plain class: one is built per round)."""

    __slots__ = ("victims", "decodes", "swap_in", "to_gpu", "to_cpu", "marks", "chunks",
                 "migration_only", "running")

    def __init__(self):
        self.victims: list = []
        self.decodes: list = []
        self.swap_in: list = []
        self.to_gpu: list = []
        self.to_cpu: list = []
        self.marks: list = []
        self.chunks: dict = {}          # prompt tokens prefilled this round
        self.migration_only = False
        # (ids, computed, blocks) of the running queue as the plan read them (int64 arrays),
        # then computed and blocks as lists of ints:
        # a leap planned in the same step reuses them (nothing changes them in between)
        self.running = None

    @property
    def empty(self) -> bool:
        return not (self.victims or self.decodes or self.swap_in or self.to_gpu or self.to_cpu
                    or self.marks)

    @property
    def has_forward(self) -> bool:
        return not self.migration_only and bool(self.decodes or self.swap_in or self.to_gpu
                                                or self.to_cpu)


def gpu_partial(eng) -> list[int]:
    """The prompt at the head of the waiting queue when it is prefilled in part on the GPU
    (chunked prefill continues one prompt at a time, first in the next round)."""
    t = eng.ctx.table
    if eng.cfg.chunked_prefill and eng.waiting:
        r = eng.waiting[0]
        if t.computed[r] > 0 and eng.dest[r] == GPU:
            return [r]
    return []


def plan_round(eng) -> Plan:
    st, t = eng.st, eng.ctx.table
    gp, hp = st.gpu_pool, st.host_pool
    bs, gcap, hcap = gp.block_size, gp.num_blocks, hp.num_blocks
    plan = Plan()
    cpu_waiting_was_empty = not st.cpu_waiting
    eng.marks = [r for r in eng.marks if st.marked[r]]
    run = eng.running
    ids = np.array(run, dtype=np.int64)
    comp, held = t.computed[ids], t.blocks[ids]
    cl, hl = comp.tolist(), held.tolist()
    plan.running = (ids, comp, held, cl, hl)
    # blocks each decode needs for one more token: ceil((c + 1) / bs) − held, at least 0
    # ((c + bs) // bs is that ceiling for c ≥ 0), on Python ints: a few dozen requests, where
    # each numpy call costs more than the loop (the same integers)
    nb = [d if (d := (c + bs) // bs - h) > 0 else 0 for c, h in zip(cl, hl)]
    free = gp.num_free
    need = sum(nb)
    host_growth = None      # Eq. 3 over the CPU batch: read by steps 2 and 5 only, when they run
    planned = 0
    keep = list(run)
    # with chunked prefill, a prompt placed on the GPU and prefilled in part is GPU-owned: its
    # finish peak stays in Q_G (at the eviction tail, the youngest) until it joins the decodes
    part_peaks = [int(st.peak[r]) for r in gpu_partial(eng)]
    if need > free:                                                   # step 2
        host_growth = st.running_growth()
        short, freed = need - free, 0
        alive = np.ones(len(run), dtype=bool)
        peaks = st.peak[ids]
        mark_peaks = [int(st.peak[r]) for r in eng.marks]
        for i in range(len(run) - 1, -1, -1):
            r = run[i]
            hb = -(-int(t.computed[r]) // bs)
            alive[i] = False
            mig = migration_blocks(mark_peaks + peaks[alive].tolist() + part_peaks, gcap)
            if fits(hp.num_used, planned + hb, host_growth, mig, hcap):
                plan.victims.append(r)
                planned += hb
                freed += int(t.blocks[r]) + nb[i]
                if freed >= short:
                    break
            else:
                alive[i] = True
        if plan.victims:
            gone = set(plan.victims)
            keep = [r for r in run if r not in gone]
            if freed < short:
                plan.migration_only = True
                return plan
            need -= sum(nb[run.index(v)] for v in plan.victims)
            free += sum(int(t.blocks[v]) for v in plan.victims)
        else:                                    # run the FIFO subset whose growth fits
            # (the prefix sums are nondecreasing: bisect_right is searchsorted(.., "right"))
            n = bisect_right(list(accumulate(nb)), free)
            keep = run[:n]
            need = sum(nb[:n])
    if len(keep) != len(run) or len(keep) > min(eng.max_seqs, eng.hard_limit):
        keep = keep[:min(eng.max_seqs, eng.hard_limit)]
        kid = np.asarray(keep, dtype=np.int64)
        need = int(np.maximum(-(-(t.computed[kid] + 1) // bs) - t.blocks[kid], 0).sum())
    # (else every decode is kept and `need` is theirs already)
    # step 3. Q_G in eviction order, tail evicted first. Requests admitted with a finish-peak
    # guarantee (swap-ins, deferred marks) sit at its head: they stay GPU-resident to the end.
    q_peaks = st.peak[ids].tolist()
    if plan.victims:
        gone = set(plan.victims)
        q_peaks = [int(st.peak[r]) for r in run if r not in gone]
    q_peaks += part_peaks
    q_peaks[:0] = [int(st.peak[r]) for r in eng.marks]
    # (B_migration is published at the end: nothing runs in between to read it)
    plan.decodes = keep                                               # step 4
    rows, tokens = len(keep), len(keep)
    gfree = free - need
    peak_sum = sum(q_peaks)
    swap_out = bool(plan.victims)

    def swap_in_pass():
        nonlocal rows, tokens, gfree, peak_sum
        chosen = set(plan.swap_in)
        for r in st.cpu_waiting:
            if r in chosen or t.generated[r] >= t.output[r]:
                continue
            if not st.ready[r] or rows >= eng.max_seqs or tokens + 1 > eng.token_limit:
                break
            kv = -(-(int(t.computed[r]) + 1) // bs)
            pk = 0 if st.marked[r] else int(st.peak[r])
            if kv > gfree or peak_sum + pk > gcap:
                break
            plan.swap_in.append(r)
            if pk:
                q_peaks.insert(0, pk)
            gfree -= kv
            peak_sum += pk
            rows += 1
            tokens += 1

    if (not swap_out and len(st.cpu_running) >= st.cpu_batch_limit and st.cpu_waiting):
        swap_in_pass()
    chunked = eng.cfg.chunked_prefill                                 # step 5
    left = max(eng.token_limit - tokens, 0)
    start = 0
    if chunked and eng.waiting and t.computed[eng.waiting[0]] > 0:
        # a prompt already partly prefilled continues first, on the residency chosen for it
        r = eng.waiting[0]
        rest = int(t.prompt[r] - t.computed[r])
        n = min(rest, left)
        start = 1 if n == rest else len(eng.waiting)
        if n > 0:
            (plan.to_gpu if eng.dest[r] == GPU else plan.to_cpu).append(r)
            plan.chunks[r] = n
            left -= n
            rows += 1
            tokens += n
    cand = []
    for i, r in enumerate(eng.waiting):
        if i < start:
            continue
        if len(cand) >= min(MAX_PREFILL_CANDIDATES, eng.max_seqs - rows) or (chunked and not left):
            break
        cand.append(r)
    if cand:
        if host_growth is None:
            host_growth = st.running_growth()
        c = np.asarray(cand, dtype=np.int64)
        pr = t.prompt[c]
        res = admit_prefills(
            (-(-pr // bs)).tolist(), st.peak[c].tolist(), gpu_queue_peaks=q_peaks,
            gpu_free=gfree, gpu_capacity=gcap, cpu_used=hp.num_used, cpu_planned=planned,
            cpu_growth=host_growth, cpu_capacity=hcap,
            prompt_tokens=None if chunked else pr.tolist(),
            max_rows=eng.max_seqs - rows, max_tokens=None if chunked else left,
            max_cpu_admits=None if eng.cfg.host_admission_limit is None else max(
                eng.cfg.host_admission_limit - len(st.cpu_running) - len(st.cpu_waiting), 0))
        staged = sum(plan.chunks[r] for r in plan.to_cpu)
        for r, d, p in zip(cand, res.dest, pr.tolist()):
            n = min(p, left) if chunked else p
            if n <= 0:
                break
            if d == "gpu":
                plan.to_gpu.append(r)
                gfree -= -(-p // bs)           # the whole prompt's persistent KV
            else:
                if (plan.to_cpu or staged) and staged + n > eng.staging_tokens:
                    break
                staged += n
                plan.to_cpu.append(r)
            plan.chunks[r] = n
            left -= n if chunked else 0
            rows += 1
            tokens += n
        q_peaks[:] = res.gpu_queue_peaks
        peak_sum = sum(q_peaks)
    if not swap_out:                                                  # step 6
        if cpu_waiting_was_empty:
            for r in st.cpu_running:
                if st.marked[r]:
                    continue
                if rows >= eng.max_seqs or tokens + 1 > eng.token_limit:
                    break
                kv = -(-(int(t.computed[r]) + 1) // bs)
                if kv > gfree or peak_sum + int(st.peak[r]) > gcap:
                    break
                plan.marks.append(r)
                q_peaks.insert(0, int(st.peak[r]))
                gfree -= kv
                peak_sum += int(st.peak[r])
                rows += 1
                tokens += 1
        else:
            swap_in_pass()
    # published after this round (`peak_sum` is Σ q_peaks: every change above kept it)
    st.migration_reserve = migration_blocks_of(q_peaks, peak_sum, gcap)
    return plan
