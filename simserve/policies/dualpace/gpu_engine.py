"""DualPace's GPU engine (App. A.1): owns prefills and GPU-resident decodes.

Each round: (1) wait for the previous Prefill-to-CPU copy group to drain (copies retire
themselves: a request becomes CPU-ready only after its last layer's copy); (2–6) plan
(`gpu_schedule.RoundPlanner`, with the placement and swap-in rules it was built with);
(7) commit — swap-outs allocate the host destination, copy the
KV D2H over PCIe, then release HBM; swap-ins allocate HBM, copy H2D, then release the host;
both finish before the forward pass — then run at most one GPU-main batch on the `GpuWorker`
and apply its tokens. Prefill-to-CPU KV is copied layer by layer as each layer finishes.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from simserve.cost import BatchShape
from simserve.policies.base import EngineBase
from simserve.policies.dualpace.copies import CopyStream
from simserve.policies.dualpace.gpu_leap import plan_leap
from simserve.policies.dualpace.gpu_schedule import RoundPlanner, fifo_placement, fifo_swap_in
from simserve.policies.dualpace.gpu_worker import MainRun
from simserve.policies.dualpace.state import CPU, GPU, MIGRATING, NONE, SharedState
from simserve.sim.clock import at

_EMPTY = np.zeros(0, dtype=np.int64)
DECODE_LOOKAHEAD = 64     # most decode steps priced per cost-model call
DECODE_FIRST = 4          # ... and fewest (a batch that changes each step needs one)


class GpuEngine(EngineBase):
    index = 0

    def __init__(self, ctx, cfg, st: SharedState, worker, cost, *, max_seqs: int,
                 token_limit: int, hard_limit: int, staging_tokens: int, poll_s: float,
                 tp: int = 1, placement=fifo_placement, swap_in=fifo_swap_in):
        self.ctx, self.cfg, self.st, self.worker, self.cost = ctx, cfg, st, worker, cost
        self.pool = st.gpu_pool
        self.max_seqs, self.token_limit, self.hard_limit = max_seqs, token_limit, hard_limit
        self.staging_tokens = staging_tokens
        self.poll_s = poll_s
        self.N = ctx.model.num_layers
        self.kv_bytes_token = ctx.model.kv_bytes_per_token_per_rank(tp)  # per GPU rank
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.marks: list[int] = []
        self.copy_done = None
        self.dest = np.zeros(ctx.table.n, dtype=np.int8)   # residency chosen at admission
        self._wake = None
        self.cpu = None                 # the CPU engine (set by build): a leap asks it
        self.counts = dict(swap_out=0, swap_in=0, prefill_to_gpu=0, prefill_to_cpu=0, marks=0,
                           migration_only_rounds=0, rounds=0, token_limited_rounds=0)
        self.p2c_copy_bytes = 0
        # how much was worked out in closed form (leaps, assists in them, copies)
        self.leap_counts = dict(leaps=0, rounds=0, assists=0, assists_after=0,
                                copy_assists=0, copy_interrupts=0)
        self._dc = None
        self._round_hint = 0.0    # a recent leapt round's length (how many to price at once)
        self._lm_s: dict = {}
        self.planner = RoundPlanner(self, placement, swap_in)
        # without decoupled scheduling: an iteration barrier with the CPU engine (`_barrier`)
        self.coupled = not cfg.decoupled
        self.in_round = False
        self.round_start = -1.0
        self.round_end = None       # an event while a round is in flight (coupled only)

    def enqueue(self, rid: int) -> None:
        self.st.owner[rid] = GPU
        self.waiting.append(rid)
        self.poke()

    def counters(self) -> dict:
        """The GPU engine's mechanism counts (run.py sums every engine's into stats["counters"])."""
        c = self.counts
        return {"num_gpu_rounds": c["rounds"], "num_prefill_to_gpu": c["prefill_to_gpu"],
                "num_prefill_to_cpu": c["prefill_to_cpu"], "num_swap_out": c["swap_out"],
                "num_swap_in": c["swap_in"], "num_swap_in_marks": c["marks"],
                "num_migration_only_rounds": c["migration_only_rounds"],
                "num_token_limited_rounds": c["token_limited_rounds"],
                "num_dense_assist_calls": self.worker.num_assists,
                "num_gpu_blocks": self.pool.num_blocks,
                "gpu_kv_peak_blocks": self.pool.peak_used}

    def poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # -- the engine process ---------------------------------------------------------------
    def run(self):
        env = self.ctx.env
        while True:
            if self.copy_done is not None:                      # step 1
                yield self.copy_done
                self.copy_done = None
            if self.coupled and self.cpu.in_batch:              # the iteration barrier
                yield self.cpu.batch_end
                continue
            plan = self.planner.plan_round()
            if plan.empty:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if self.coupled:
                yield from self._coupled_round(plan)
                continue
            self.counts["rounds"] += 1
            if self.cfg.leap:
                lp = plan_leap(self, plan)
                if lp is not None:
                    lp.commit()
                    with self.worker.hold() as req:     # the GPU is the leap's
                        yield req
                        yield at(env, lp.end)
                    lp.apply()
                    self.st.poke_cpu()
                    continue
            yield from self._commit(plan)
            if plan.has_forward:
                yield from self._forward(plan)
            elif plan.migration_only:
                self.counts["migration_only_rounds"] += 1
            self.st.poke_cpu()

    def _coupled_round(self, plan):
        """One round behind the iteration barrier (decoupled scheduling off), planned once no
        CPU batch is in flight; the CPU engine starts its next batch with it."""
        env = self.ctx.env
        self.counts["rounds"] += 1
        self.in_round, self.round_start = True, env.now
        self.round_end = env.event()
        self.st.poke_cpu()               # the CPU engine may start its batch now, with us
        yield from self._commit(plan)
        if plan.has_forward:
            yield from self._forward(plan)
        elif plan.migration_only:
            self.counts["migration_only_rounds"] += 1
        self.in_round = False
        self.round_end.succeed()
        self.st.poke_cpu()

    # -- step 7: commit migrations and admissions ------------------------------------------
    def _commit(self, plan):
        st, t = self.st, self.ctx.table
        bs = self.pool.block_size
        ch = self.ctx.cluster.gpus[0]
        new_cpu = [r for r in plan.to_cpu if t.computed[r] == 0]
        if new_cpu and not plan.migration_only:
            # B_planned made visible at once: the CPU engine may run a round during the
            # migrations below, and must see these persistent host blocks as used
            c = np.asarray(new_cpu, dtype=np.int64)
            self.dest[c] = CPU
            hb = -(-t.prompt[c] // bs)
            st.host_pool.allocate(int(hb.sum()))
            st.host_blocks[c] = hb
            st.owner[c] = MIGRATING
            st.cpu_waiting.extend(new_cpu)             # unready until the last layer's copy
            self.counts["prefill_to_cpu"] += len(c)
        if plan.victims:
            v = np.asarray(plan.victims, dtype=np.int64)
            hb = -(-t.computed[v] // bs)
            st.host_pool.allocate(int(hb.sum()))      # host destination before release
            st.host_blocks[v] = hb
            st.owner[v] = MIGRATING
            gone = set(plan.victims)
            self.running = [r for r in self.running if r not in gone]
            yield from ch.d2h.transfer(float(t.computed[v].sum()) * self.kv_bytes_token)
            self.pool.free(int(t.blocks[v].sum()))
            t.blocks[v] = 0
            st.owner[v] = CPU
            st.cpu_waiting.extend(plan.victims)
            st.set_ready(v)
            self.counts["swap_out"] += len(v)
        if plan.swap_in:
            s = np.asarray(plan.swap_in, dtype=np.int64)
            chosen = set(plan.swap_in)
            st.cpu_waiting = deque(r for r in st.cpu_waiting if r not in chosen)
            gb = -(-t.computed[s] // bs)
            self.pool.allocate(int(gb.sum()))          # HBM destination before release
            t.blocks[s] = gb
            st.owner[s] = MIGRATING
            yield from ch.h2d.transfer(float(t.computed[s].sum()) * self.kv_bytes_token)
            st.host_pool.free(int(st.host_blocks[s].sum()))
            st.host_blocks[s] = 0
            st.owner[s] = GPU
            st.marked[s] = False
            self.running[:0] = plan.swap_in        # finish-peak admitted: head of Q_G
            self.counts["swap_in"] += len(s)
        for r in plan.marks:
            st.marked[r] = True
            self.marks.append(r)
        self.counts["marks"] += len(plan.marks)

    # -- one GPU-main batch ----------------------------------------------------------------
    def _forward(self, plan):
        env, st, t = self.ctx.env, self.st, self.ctx.table
        bs = self.pool.block_size
        dl = plan.decodes + plan.swap_in
        ids, comp, _, cl, hl = plan.running
        if plan.victims or plan.swap_in or len(dl) != len(cl):
            dec = np.asarray(dl, dtype=np.int64)
            comp = t.computed[dec]
            cl, hl = comp.tolist(), t.blocks[dec].tolist()
        else:
            # every running request decodes, as the plan read them: `_commit` moved nothing
            # and did not yield (no victims, no swap-ins), so their KV is unchanged since
            dec = ids
        ctx = comp + 1                                 # each decode's attention length
        # ceil(ctx / bs) − held, at least 0, on Python ints (a few dozen decodes: cheaper than
        # numpy calls; the same integers)
        nb = [d if (d := (c + bs) // bs - h) > 0 else 0 for c, h in zip(cl, hl)]
        self.pool.allocate(sum(nb))
        t.blocks[dec] = np.asarray([h + x for h, x in zip(hl, nb)], dtype=np.int64)
        if st.owner[dec].tolist().count(GPU) != len(dl):
            raise RuntimeError("GPU engine: batch holds a decode it does not own")
        ctx_sum = sum(ctx_l := ctx.tolist())
        prefill = bool(plan.to_gpu or plan.to_cpu)
        if prefill:
            pre = plan.to_gpu + plan.to_cpu
            pre_ids = np.asarray(pre, dtype=np.int64)
            ctx0 = t.computed[pre_ids]
            ng = len(plan.to_gpu)
            g = [r for r, x in zip(plan.to_gpu, ctx0.tolist()) if x == 0]
            if g:                                      # persistent HBM for the whole prompt
                g = np.asarray(g, dtype=np.int64)
                gb = -(-t.prompt[g] // bs)
                self.pool.allocate(int(gb.sum()))
                t.blocks[g] = gb
                self.dest[g] = GPU
                self.counts["prefill_to_gpu"] += len(g)
            c = np.asarray(plan.to_cpu, dtype=np.int64)
            cl = [plan.chunks[r] for r in pre]
            chunks = np.asarray(cl, dtype=np.int64)
            last = pre_ids[ctx0 + chunks >= t.prompt[pre_ids]]  # these sample a first token
            shape = BatchShape(num_tokens=len(dl) + sum(cl), prefill_chunks=chunks,
                               prefill_ctx=ctx0, num_decodes=len(dl), decode_ctx_sum=ctx_sum,
                               num_sample_rows=len(dl) + len(last), decode_ctx=ctx,
                               decode_ctx_max=max(ctx_l) if ctx_l else None)
            run = self._main_run(shape)
            if len(c):
                nbytes = float(sum(cl[ng:])) * self.kv_bytes_token / self.N
                run.on_start = lambda: self._start_copies(run, c, nbytes)
        else:
            run = self._stages(self._decode_s(len(dl), ctx_sum, max(ctx_l)), len(dl), len(dl))
        run.applied = env.event()
        yield env.process(self.worker.run_main(run))
        t.computed[dec] = ctx
        if prefill:
            if st.log is not None:
                st.log.append((run.start, env.now, "gpu", np.concatenate((dec, pre_ids))))
            t.computed[pre_ids] += chunks
            while self.waiting and t.computed[self.waiting[0]] >= t.prompt[self.waiting[0]]:
                self.waiting.popleft()                 # prefilled prompts leave the queue
            done = t.emit(np.concatenate((dec, last)), env.now)
            self.running.extend(r for r in last.tolist() if self.dest[r] == GPU)
        else:
            if st.log is not None:
                st.log.append((run.start, env.now, "gpu", dec))
            done = t.emit(dec, env.now)
        self.release(done)
        run.applied.succeed()
        rec = self.ctx.recorder
        if rec.trace is not None:
            rec.trace.iteration(
                f"GPU engine {self.index}", run.start, env.now,
                "mixed" if prefill and len(dec) else "prefill" if prefill else "decode",
                prefill_tokens=int(chunks.sum()) if prefill else 0,
                prefill_chunks=chunks if prefill else [],
                prefill_to_cpu=len(plan.to_cpu), decodes=len(dec),
                kv_blocks_used=self.pool.num_used, host_kv_blocks_used=st.host_pool.num_used)
        rec.num_iterations += 1
        rec.num_steps_scheduled += 1
        rec.sample(env.now, self.index, len(self.running), len(self.waiting),
                   self.pool.num_used, t.num_emitted)

    def _main_run(self, shape: BatchShape) -> MainRun:
        """Split the whole-forward time into pre-layer (host overheads), N equal layers and
        the post-layer (LM head); staged execution adds the empty-poll cost per layer."""
        cm = self.cost
        if shape.num_prefills:
            total = float(cm.step_s(shape))
        else:
            total = self._decode_s(shape.num_decodes, shape.decode_ctx_sum,
                                   int(shape.decode_ctx.max()))
        return self._stages(total, shape.num_prefills + shape.num_decodes,
                            shape.num_sample_rows)

    def _stages(self, total: float, seqs: int, rows: int) -> MainRun:
        pre, layer, post = self._split(total, seqs, rows)
        return MainRun(self.ctx.env.now, pre, layer, post, self.N)

    def _split(self, total: float, seqs: int, rows: int) -> tuple[float, float, float]:
        """(pre-layer, one layer, post-layer) seconds of a batch of `total` seconds."""
        cm = self.cost
        pre = (cm.iter_us + cm.per_seq_us * seqs) * 1e-6
        post = self._lm_s.get(rows)
        if post is None:
            post = self._lm_s[rows] = float(cm.ops.lm_head(rows)) * 1e-6
        layer = max(total - pre - post, 0.0) / self.N
        if self.worker.staged:
            layer += self.poll_s
        return pre, layer, post

    def _decode_s(self, B: int, S: int, cmax: int) -> float:
        """`GpuCostModel.decode_only_s(B, S, cmax)`: the same decodes one step later have
        S + B and cmax + 1, so the next steps are priced with it at once (identical floats:
        `decode_steps_list` is the array call's arithmetic, tests check). A few steps at
        first, twice as many each time a run of steps used all of the last batch."""
        c = self._dc                   # (B, S, cmax of its first step, the steps' seconds)
        n = DECODE_FIRST
        if c is not None and c[0] == B:
            j = cmax - c[2]
            d = c[3]
            if 0 <= j <= len(d) and S == c[1] + B * j:
                if j < len(d):
                    return d[j]
                n = min(2 * len(d), DECODE_LOOKAHEAD)   # the next steps of a run
        d = self._decode_steps(B, S, cmax, n)
        self._dc = (B, S, cmax, d)
        return d[0]

    def _decode_run(self, B: int, S: int, cmax: int, n: int) -> list[float]:
        """`decode_only_s(B, S + B·j, cmax + j)` for j = 0, 1, ...: what the last priced run
        holds from this step on, else n steps priced now (and kept for `_decode_s`)."""
        c = self._dc
        if c is not None and c[0] == B:
            j = cmax - c[2]
            d = c[3]
            if 0 <= j < len(d) and S == c[1] + B * j:
                return d[j:]
        d = self._decode_steps(B, S, cmax, n)
        self._dc = (B, S, cmax, d)
        return d

    def _decode_steps(self, B: int, S: int, cmax: int, n: int) -> list[float]:
        """`decode_only_s(B, S + B·j, cmax + j)` for j < n, as a list (the same floats)."""
        cost = self.cost
        if getattr(type(cost), "decode_steps_list", None) is None:
            i = np.arange(n, dtype=np.int64)   # wrappers (a real executor's replay)
            return np.atleast_1d(cost.decode_only_s(B, S + B * i, cmax + i)).tolist()
        if n <= cost.list_steps:
            return cost.decode_steps_list(B, S, cmax, n)
        return cost.decode_steps_s(B, S, cmax, n).tolist()

    def release(self, done) -> None:
        """Requests that just finished give back their GPU KV and leave the running queue."""
        if not len(done):
            return
        st, t = self.st, self.ctx.table
        on_gpu = done[st.owner[done] == GPU]
        self.pool.free(int(t.blocks[on_gpu].sum()))
        t.blocks[on_gpu] = 0
        st.owner[on_gpu] = NONE
        gone = set(on_gpu.tolist())
        self.running = [r for r in self.running if r not in gone]
    def _start_copies(self, run: MainRun, ids: np.ndarray, nbytes_layer: float):
        self.copy_done = CopyStream(self, run, ids, nbytes_layer).proc
