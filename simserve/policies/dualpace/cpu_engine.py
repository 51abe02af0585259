"""DualPace's CPU engine (App. A.2): its own queues and clock over host-resident requests.

Each round: (1) snapshot host KV use, the batch limit C, the token limit and the latest
B_migration; (2) keep the running frontier FIFO while rows, tokens and the envelope
(used + Σ(b̂ − b) of the kept + B_migration ≤ capacity) allow — requests marked for swap-in
are yielded to the front of the waiting queue, the unscheduled suffix too, and if anything
moved no waiting request is admitted; (3) otherwise admit the ready FIFO prefix of the waiting
queue (finished entries dropped, stop at the first unready one); (4) with nothing selected,
wait on the head's readiness (never skip it) or for the GPU engine to change something;
(5) allocate next-token host blocks only, run one batch (`CpuBatchExecutor`), apply tokens.
"""
from __future__ import annotations

import numpy as np

from simserve.policies.base import EngineBase
from simserve.policies.dualpace.state import CPU, NONE, SharedState

_sum = np.add.reduce     # ndarray.sum without its Python wrapper (the same reduction)


class CpuEngine(EngineBase):
    index = 1

    def __init__(self, ctx, st: SharedState, executor, batch_limit: int, token_limit: int):
        self.ctx, self.st, self.ex = ctx, st, executor
        self.C = batch_limit
        self.token_limit = token_limit
        self.pool = st.host_pool            # run.py reports its peak / end use
        self.gpu_poke = None                # set by build: wakes the GPU engine
        self.num_batches = 0
        self.num_tokens = 0                 # tokens decoded on the CPU
        self.busy_s = 0.0
        self.in_batch = False               # running a batch (`ex` knows where it stands)
        self.gpu = None                     # the GPU engine (set by build): the barrier
        self.batch_end = None               # an event while a batch runs (coupled only)

    def counters(self) -> dict:
        """The CPU tier's mechanism counts: batches, tokens decoded here, busy time, batches
        per Dense Assist route (Eq. 5), the host pool's peak."""
        full, split, fused = self.ex.route_counts
        return {"num_cpu_batches": self.num_batches, "num_cpu_tokens": self.num_tokens,
                "cpu_busy_s": self.busy_s, "num_full_cpu_batches": full,
                "num_split_final_batches": split, "num_fused_assist_batches": fused,
                "num_cpu_blocks": self.pool.num_blocks, "host_kv_peak_blocks": self.pool.peak_used}

    def _select(self) -> list[int]:
        st, t = self.st, self.ctx.table
        pool = st.host_pool
        room = pool.num_blocks - pool.num_used - st.migration_reserve      # step 1
        rows = min(self.C, self.token_limit)
        # step 2: the running frontier
        running = st.cpu_running
        marked: list[int] = []
        keep_c = list(running)
        if running:
            ids = np.array(running, dtype=np.int64)
            m = st.marked[ids]
            if np.count_nonzero(m):                     # (else every running request is kept, in order)
                is_marked = m.tolist()
                marked = [r for r, x in zip(running, is_marked) if x]
                keep_c = [r for r, x in zip(running, is_marked) if not x]
                ids = np.asarray(keep_c, dtype=np.int64)
        sel: list[int] = []
        used = 0                            # Σ growth of `sel`
        if keep_c:
            # (ufunc methods and ndarray methods: numpy's module functions wrap them in Python)
            need = np.add.accumulate(np.maximum(st.peak[ids] - st.host_blocks[ids], 0))
            n = int(min(need.searchsorted(room, "right"), rows))
            sel = keep_c[:n]
            suffix = keep_c[n:]
            used = int(need[n - 1]) if n else 0
        else:
            suffix = []
        moved = marked + suffix
        if moved:
            st.cpu_waiting.extendleft(reversed(moved))
            st.cpu_running = sel
            return sel
        # step 3: the ready waiting prefix
        w = st.cpu_waiting
        while w and len(sel) < rows:
            r = w[0]
            if t.generated[r] >= t.output[r]:
                w.popleft()                 # finished entries are removed
                continue
            if not st.ready[r]:
                break
            g = max(int(st.peak[r] - st.host_blocks[r]), 0)
            if used + g > room:
                break
            used += g
            w.popleft()
            sel.append(r)
        st.cpu_running = sel
        return sel

    def idle_for_good(self) -> bool:
        """Waiting, and `_select` would find nothing and change nothing until the GPU engine
        moves a request or the host pool: nothing running, and the waiting head (if any)
        unfinished and either not ready or beyond the envelope."""
        st, t = self.st, self.ctx.table
        if self.in_batch or st.cpu_running:
            return False
        w = st.cpu_waiting
        if not w:
            return True
        r = w[0]
        if t.generated[r] >= t.output[r]:
            return False
        if not st.ready[r]:
            return True
        pool = st.host_pool
        room = pool.num_blocks - pool.num_used - st.migration_reserve
        return max(int(st.peak[r] - st.host_blocks[r]), 0) > room

    def run(self):
        env, st, t = self.ctx.env, self.st, self.ctx.table
        bs = st.host_pool.block_size
        gpu = self.gpu if self.gpu is not None and self.gpu.coupled else None
        while True:
            if gpu is not None and gpu.in_round and gpu.round_start < env.now:
                yield gpu.round_end     # the barrier: start only with a GPU round
                continue
            sel = self._select()
            if self.gpu_poke is not None:
                self.gpu_poke()
            if not sel:                                  # step 4
                w = st.cpu_waiting
                wake = st.cpu_wait_event()
                if w and not st.ready[w[0]] and t.generated[w[0]] < t.output[w[0]]:
                    yield st.ready_event(w[0]) | wake
                else:
                    yield wake
                continue
            ids = np.asarray(sel, dtype=np.int64)        # step 5
            if np.count_nonzero(st.owner[ids] != CPU):
                raise RuntimeError("CPU engine: batch holds a request it does not own")
            ctx = t.computed[ids] + 1
            nb = np.maximum((ctx + (bs - 1)) // bs - st.host_blocks[ids], 0)  # ceil − held
            st.host_pool.allocate(int(_sum(nb)))
            st.host_blocks[ids] += nb
            ctx_sum = int(_sum(ctx))
            t0 = env.now
            self.in_batch = True
            if gpu is not None:
                self.batch_end = env.event()
            yield env.process(self.ex.run(len(ids), ctx_sum))
            self.in_batch = False
            if gpu is not None:
                self.batch_end.succeed()
            self.busy_s += env.now - t0
            self.num_batches += 1
            if self.ctx.recorder.trace is not None:
                self.ctx.recorder.trace.iteration(
                    f"CPU engine {self.index}", t0, env.now, "CPU decode", group="cpu",
                    prefill_tokens=0, decodes=len(ids), context_tokens=ctx_sum,
                    host_kv_blocks_used=st.host_pool.num_used)
            self.num_tokens += len(ids)
            self.ctx.recorder.num_iterations += 1
            self.ctx.recorder.num_steps_scheduled += 1
            if st.log is not None:
                st.log.append((t0, env.now, "cpu", ids.copy()))
            t.computed[ids] += 1
            done = t.emit(ids, env.now, on_cpu=True)
            if len(done):
                st.host_pool.free(int(_sum(st.host_blocks[done])))
                st.host_blocks[done] = 0
                st.owner[done] = NONE
                st.marked[done] = False
                gone = set(done.tolist())
                st.cpu_running = [r for r in st.cpu_running if r not in gone]
            self.ctx.recorder.sample(env.now, self.index, len(st.cpu_running),
                                     len(st.cpu_waiting), st.host_pool.num_used, t.num_emitted)
            if self.gpu_poke is not None:
                self.gpu_poke()
            if gpu is not None:
                yield env.timeout(0)    # let a GPU round waiting on this batch start first
