"""Steps 2–6 of DualPace's GPU engine round (App. A.1): `RoundPlanner.plan_round` returns a
plan; step 7 (commit and execute) is in `gpu_engine.py`.

2 next-token HBM feasibility: swap-out victims from the eviction tail whose KV the host
  accepts under Eq. 2 (an infeasible tail request is skipped); no victim → the FIFO subset of
  decodes whose growth fits; victims that free only part → a migration-only round;
3 B_migration over the remaining GPU ownership queue (plus deferred swap-in marks), published;
4 all remaining decodes; early swap-in of a ready CPU-waiting prefix when the CPU batch is full,
  its waiting queue non-empty and no swap-out happens (each fits next-token HBM and b̂);
5 FIFO prefills placed by the placement rule (default `fifo_placement`: GPU if its prompt KV
  fits HBM and Eq. 2 holds with the longer queue, else CPU; order preserving), then the
  staging limit;
6 with no swap-out: a second swap-in pass, or, if the CPU waiting queue was empty before step
  4, deferred swap-in marks on CPU-running requests (reserving b̂, not moving ownership).

Two rules are hooks the engine is built with (`engine.build_dualpace(..., placement=,
swap_in=)`), so a variant replaces them without touching this module:

- placement(candidates: PrefillCandidates) -> envelope.PrefillPlacement: where each FIFO
  candidate of step 5 goes; the first `num_admitted` are admitted, `dest[i]` "gpu" or "cpu".
- swap_in(planner: RoundPlanner, mark: bool = False) -> None: the swap-in passes of steps 4
  and 6, or with `mark` the deferred swap-in marks of step 6. A rule walks
  `planner.swap_in_candidates(mark)` (FIFO order) and calls `planner.take_swap_in(r, mark)`
  for each request it wants, which checks the round's limits, records `r` in the plan and
  keeps the planner's named round state (`rows`, `tokens`, `gpu_free`, `peak_sum`,
  `q_peaks`) up to date; it returns False when `r` does not fit (FIFO stops there).
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from simserve.policies.dualpace.envelope import (PrefillPlacement, admit_prefills, fits,
                                                 migration_blocks, migration_blocks_of)
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


@dataclass(frozen=True, slots=True)
class PrefillCandidates:
    """What the placement rule sees of one round's FIFO prefill candidates: their request ids,
    prompt tokens, prompt KV blocks and finish peaks b̂ (one entry each, FIFO order), and
    `envelope`, the keyword arguments of `envelope.admit_prefills` for this round (Q_G's
    peaks, free HBM, the host pool's used / planned / growth / capacity, the row, token and
    host-admission limits)."""

    ids: list
    prompt_tokens: list
    prompt_blocks: list
    peak_blocks: list
    envelope: dict


def fifo_placement(c: PrefillCandidates) -> PrefillPlacement:
    """App. A.1 step 5, the default placement rule: `envelope.admit_prefills`."""
    return admit_prefills(c.prompt_blocks, c.peak_blocks, **c.envelope)


def fifo_swap_in(p: "RoundPlanner", mark: bool = False) -> None:
    """The default swap-in rule. Steps 4 and 6 (`mark` False): a ready FIFO prefix of the CPU
    waiting queue, each fitting the row and token limits, next-token HBM and (unless already
    marked) its finish peak b̂ within the GPU pool. Step 6 with an empty CPU waiting queue
    (`mark` True): the same test over CPU-running requests not yet marked, which are marked
    for a future swap-in (`plan.marks`: b̂ and next-token HBM reserved, ownership kept)."""
    for r in p.swap_in_candidates(mark):
        if not p.take_swap_in(r, mark):
            break


class RoundPlanner:
    """Plans the GPU engine's rounds (steps 2–6) with the engine's placement and swap-in
    rules. The round's named state, read and kept up to date by the rules: `plan`, `rows`
    and `tokens` taken so far, `gpu_free` (HBM blocks left after the decodes' growth),
    `q_peaks` (Q_G's finish peaks in eviction order, tail evicted first) and `peak_sum`
    (their sum), `planned` (B_planned) and `host_growth` (B_growth, None until read)."""

    __slots__ = ("eng", "placement", "swap_in", "bs", "gcap", "plan", "rows", "tokens",
                 "gpu_free", "q_peaks", "peak_sum", "planned", "host_growth", "no_cpu")

    def __init__(self, eng, placement=fifo_placement, swap_in=fifo_swap_in):
        self.eng, self.placement, self.swap_in = eng, placement, swap_in
        gp = eng.st.gpu_pool
        self.bs, self.gcap = gp.block_size, gp.num_blocks
        self.no_cpu = not getattr(eng.cfg, "prefill_to_cpu", True)

    @property
    def table(self):
        """The request table the rules read (`prompt`, `output`, `computed`, `generated`, a
        trace's extra columns in `attrs`)."""
        return self.eng.ctx.table

    def swap_in_candidates(self, mark: bool = False):
        """The requests a swap-in pass looks at, in order: the CPU waiting queue's not yet
        chosen, unfinished requests, up to the first one not ready (its prompt still being
        copied); with `mark`, the CPU-running requests not yet marked."""
        st, t = self.eng.st, self.eng.ctx.table
        if mark:
            yield from (r for r in st.cpu_running if not st.marked[r])
            return
        chosen = set(self.plan.swap_in)
        for r in st.cpu_waiting:
            if r in chosen or t.generated[r] >= t.output[r]:
                continue
            if not st.ready[r]:
                return
            yield r

    def take_swap_in(self, r: int, mark: bool = False) -> bool:
        """Swap request `r` in this round (with `mark`, mark it for a later swap-in) if it fits
        the row and token limits, next-token HBM and, unless already marked, its finish peak
        b̂ within the GPU pool; False (and nothing taken) otherwise."""
        eng, st, t = self.eng, self.eng.st, self.eng.ctx.table
        if self.rows >= eng.max_seqs or self.tokens + 1 > eng.token_limit:
            return False
        kv = -(-(int(t.computed[r]) + 1) // self.bs)
        pk = int(st.peak[r]) if mark or not st.marked[r] else 0
        if kv > self.gpu_free or self.peak_sum + pk > self.gcap:
            return False
        (self.plan.marks if mark else self.plan.swap_in).append(r)
        if pk:
            self.q_peaks.insert(0, pk)
        self.gpu_free -= kv
        self.peak_sum += pk
        self.rows += 1
        self.tokens += 1
        return True

    def plan_round(self) -> Plan:
        eng, st = self.eng, self.eng.st
        plan = self.plan = Plan()
        cpu_waiting_was_empty = not st.cpu_waiting
        eng.marks = [r for r in eng.marks if st.marked[r]]
        keep, need, free, part_peaks = self._make_room(plan)
        if plan.migration_only:
            return plan
        run = eng.running
        t = eng.ctx.table
        if len(keep) != len(run) or len(keep) > min(eng.max_seqs, eng.hard_limit):
            keep = keep[:min(eng.max_seqs, eng.hard_limit)]
            kid = np.asarray(keep, dtype=np.int64)
            need = int(np.maximum(-(-(t.computed[kid] + 1) // self.bs) - t.blocks[kid], 0).sum())
        # (else every decode is kept and `need` is theirs already)
        # step 3. Q_G in eviction order, tail evicted first. Requests admitted with a
        # finish-peak guarantee (swap-ins, deferred marks) sit at its head: they stay
        # GPU-resident to the end.
        ids = plan.running[0]
        q_peaks = st.peak[ids].tolist()
        if plan.victims:
            gone = set(plan.victims)
            q_peaks = [int(st.peak[r]) for r in run if r not in gone]
        q_peaks += part_peaks
        q_peaks[:0] = [int(st.peak[r]) for r in eng.marks]
        # (B_migration is published at the end: nothing runs in between to read it)
        plan.decodes = keep                                           # step 4
        self.rows = self.tokens = len(keep)
        self.gpu_free = free - need
        self.q_peaks, self.peak_sum = q_peaks, sum(q_peaks)
        swap_out = bool(plan.victims)
        if (not swap_out and len(st.cpu_running) >= st.cpu_batch_limit and st.cpu_waiting):
            self.swap_in(self)
        self._prefills(plan)                                          # step 5
        if not swap_out:                                              # step 6
            self.swap_in(self, mark=cpu_waiting_was_empty)
        # published after this round (`peak_sum` is Σ q_peaks: every change above kept it)
        st.migration_reserve = migration_blocks_of(self.q_peaks, self.peak_sum, self.gcap)
        return plan

    def _make_room(self, plan: Plan):
        """Step 2: (decodes kept, their next-token blocks, free HBM blocks, finish peaks of a
        partly prefilled GPU prompt); sets `plan.victims` / `plan.migration_only`."""
        eng, st, t = self.eng, self.eng.st, self.eng.ctx.table
        gp, hp = st.gpu_pool, st.host_pool
        bs, gcap, hcap = self.bs, self.gcap, hp.num_blocks
        run = eng.running
        ids = np.array(run, dtype=np.int64)
        comp, held = t.computed[ids], t.blocks[ids]
        cl, hl = comp.tolist(), held.tolist()
        plan.running = (ids, comp, held, cl, hl)
        # blocks each decode needs for one more token: ceil((c + 1) / bs) − held, at least 0
        # ((c + bs) // bs is that ceiling for c ≥ 0), on Python ints: a few dozen requests,
        # where each numpy call costs more than the loop (the same integers)
        nb = [d if (d := (c + bs) // bs - h) > 0 else 0 for c, h in zip(cl, hl)]
        free = gp.num_free
        need = sum(nb)
        self.host_growth = None  # Eq. 3 over the CPU batch: read by steps 2 and 5 only
        self.planned = 0
        keep = list(run)
        # with chunked prefill, a prompt placed on the GPU and prefilled in part is GPU-owned:
        # its finish peak stays in Q_G (at the eviction tail, the youngest) until it decodes
        part_peaks = [int(st.peak[r]) for r in gpu_partial(eng)]
        if need <= free:
            return keep, need, free, part_peaks
        host_growth = self.host_growth = st.running_growth()
        short, freed = need - free, 0
        alive = np.ones(len(run), dtype=bool)
        peaks = st.peak[ids]
        mark_peaks = [int(st.peak[r]) for r in eng.marks]
        for i in range(len(run) - 1, -1, -1):
            r = run[i]
            hb = -(-int(t.computed[r]) // bs)
            alive[i] = False
            mig = migration_blocks(mark_peaks + peaks[alive].tolist() + part_peaks, gcap)
            if fits(hp.num_used, self.planned + hb, host_growth, mig, hcap):
                plan.victims.append(r)
                self.planned += hb
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
                return keep, need, free, part_peaks
            need -= sum(nb[run.index(v)] for v in plan.victims)
            free += sum(int(t.blocks[v]) for v in plan.victims)
        else:                                    # run the FIFO subset whose growth fits
            # (the prefix sums are nondecreasing: bisect_right is searchsorted(.., "right"))
            n = bisect_right(list(accumulate(nb)), free)
            keep = run[:n]
            need = sum(nb[:n])
        return keep, need, free, part_peaks

    def _continue_partial(self, plan: Plan, left: int) -> tuple[int, int]:
        """A prompt already partly prefilled continues first, on the residency chosen for it:
        (tokens left, index of the first new candidate in the waiting queue)."""
        eng, t = self.eng, self.eng.ctx.table
        if not (eng.cfg.chunked_prefill and eng.waiting and t.computed[eng.waiting[0]] > 0):
            return left, 0
        r = eng.waiting[0]
        rest = int(t.prompt[r] - t.computed[r])
        n = min(rest, left)
        start = 1 if n == rest else len(eng.waiting)
        if n > 0:
            (plan.to_gpu if eng.dest[r] == GPU else plan.to_cpu).append(r)
            plan.chunks[r] = n
            left -= n
            self.rows += 1
            self.tokens += n
        return left, start

    def _candidates(self, plan: Plan, chunked: bool, left: int):
        """Step 5's FIFO candidates, as the placement rule sees them (None: no candidate)."""
        eng, st, t = self.eng, self.eng.st, self.eng.ctx.table
        left, start = self._continue_partial(plan, left)
        cand = []
        for i, r in enumerate(eng.waiting):
            if i < start:
                continue
            if len(cand) >= min(MAX_PREFILL_CANDIDATES, eng.max_seqs - self.rows) or (
                    chunked and not left):
                break
            cand.append(r)
        if not cand:
            return None, left
        if self.host_growth is None:
            self.host_growth = st.running_growth()
        hp, bs = st.host_pool, self.bs
        c = np.asarray(cand, dtype=np.int64)
        pr = t.prompt[c].tolist()
        limit = eng.cfg.host_admission_limit
        cpu_admits = 0 if self.no_cpu else None if limit is None else max(
            limit - len(st.cpu_running) - len(st.cpu_waiting), 0)
        env = dict(gpu_queue_peaks=self.q_peaks, gpu_free=self.gpu_free, gpu_capacity=self.gcap,
                   cpu_used=hp.num_used, cpu_planned=self.planned,
                   cpu_growth=self.host_growth, cpu_capacity=hp.num_blocks,
                   prompt_tokens=None if chunked else pr,
                   max_rows=eng.max_seqs - self.rows, max_tokens=None if chunked else left,
                   max_cpu_admits=cpu_admits)
        return PrefillCandidates(cand, pr, [-(-p // bs) for p in pr], st.peak[c].tolist(),
                                 env), left

    def _prefills(self, plan: Plan) -> None:
        """Step 5: the placement rule's decisions, then the staging limit."""
        eng = self.eng
        chunked = eng.cfg.chunked_prefill
        cands, left = self._candidates(plan, chunked, max(eng.token_limit - self.tokens, 0))
        if cands is None:
            return
        res = self.placement(cands)
        if res.stop == "tokens":
            eng.counts["token_limited_rounds"] += 1
        staged = sum(plan.chunks[r] for r in plan.to_cpu)
        bs = self.bs
        for r, d, p in zip(cands.ids, res.dest, cands.prompt_tokens):
            n = min(p, left) if chunked else p
            if n <= 0:
                break
            if d == "gpu":
                plan.to_gpu.append(r)
                self.gpu_free -= -(-p // bs)           # the whole prompt's persistent KV
            else:
                if (plan.to_cpu or staged) and staged + n > eng.staging_tokens:
                    break
                staged += n
                plan.to_cpu.append(r)
            plan.chunks[r] = n
            left -= n if chunked else 0
            self.rows += 1
            self.tokens += n
        self.q_peaks[:] = res.gpu_queue_peaks
        self.peak_sum = sum(self.q_peaks)
