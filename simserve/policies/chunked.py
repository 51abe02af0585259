"""Chunked-prefill engines on one GPU (or one TP group): `vllm` (V1 scheduler) and `sarathi`.

vLLM V1 (policies.md §2): running requests first, in admission order, each given the tokens
that catch it up (1 for a decode, the rest of a prompt for a partial prefill) within the token
budget; a request whose blocks do not fit preempts the newest running request (recompute: all
its KV freed, back to the front of the waiting queue); then, only if nothing was preempted,
waiting requests FCFS while the budget, `max_num_seqs` and the KV pool allow (head-of-line
blocking). KV is allocated incrementally, block by block.

Sarathi-Serve (§3): decodes first (a decode that cannot grow preempts the tail of the running
list), then partial prefills, then new prompts FCFS, each admitted only if the KV of its whole
prompt can be reserved at once.

Between interesting events (an arrival, a request finishing, a KV shortfall) a decode-only
engine repeats one step with contexts one longer; `_leap` advances k such steps at once with
results identical to stepping (tests check this), which is where the speed comes from.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from simserve.cost import BatchShape, GpuCostModel
from simserve.errors import ConfigError
from simserve.policies.chunked_config import ChunkedConfig
from simserve.sim.context import SimContext
from simserve.sim.kv import BlockPool
from simserve.sim.leap import decode_ends, largest_k, steps_before
from simserve.sim.memory import gpu_kv_budget

LEAP_CAP = 8192  # at most this many decode steps per leap (bounds the temporary arrays)


class ChunkedEngine:
    """One engine over a TP group. Subclasses implement `_schedule_running` and
    `_admission_blocks`; parameters are in `chunked_config.py`, replicas in `replicas.py`."""

    kind = "vllm"

    def __init__(self, ctx: SimContext, cfg: ChunkedConfig, index: int, gpus: list[int]):
        self.ctx, self.cfg, self.index, self.gpus = ctx, cfg, index, gpus
        hw = ctx.hardware
        r = cfg.resolve(float(hw.gpu.spec["memory_gib"]), hw.gpu.name)
        self.budget = r["max_num_batched_tokens"]
        self.max_seqs = r["max_num_seqs"]
        kv = gpu_kv_budget(ctx.model, hw.gpu_memory_bytes, cfg.tp, r["gpu_memory_utilization"],
                           cfg.block_size, self.budget, self.max_seqs,
                           activation_reserve_gib=cfg.activation_reserve_gib,
                           cuda_graphs=cfg.cuda_graphs, graphs_counted=r["graphs_counted"])
        blocks = cfg.num_gpu_blocks_override or kv.num_blocks
        if blocks < 1:
            raise ConfigError(f"policy {self.kind}: no memory left for KV on {hw.gpu.name} at TP"
                              f"{cfg.tp} ({kv.summary()}); use a larger TP degree or GPU")
        self.pool = BlockPool(f"engine{index}.gpu_kv", blocks, cfg.block_size)
        self.kv_summary = dict(kv.summary(), num_gpu_blocks=blocks, **r)
        try:
            self.cost = GpuCostModel(ctx.model, hw.gpu, cfg.tp, hw.nvlink, cfg.cuda_graphs,
                                     table_tokens=max(self.budget, self.max_seqs),
                                     mixed_attention=cfg.mixed_attention,
                                     graph_max_tokens=cfg.graph_max_tokens)
        except ValueError as exc:
            raise ConfigError(f"policy {self.kind}: {exc}") from None
        if ctx.gpu_cost_hook is not None:  # e.g. the validation replay's real executor
            self.cost = ctx.gpu_cost_hook(self.cost)
        self.running: list[int] = []
        self.waiting: deque[int] = deque()
        self.clock = 0.0
        self._wake = None
        self.num_preemptions = 0

    # -- queue interface used by the router ---------------------------------------------
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def enqueue(self, rid: int) -> None:
        self.waiting.append(rid)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # -- KV helpers -----------------------------------------------------------------------
    def _blocks_needed(self, rid: int, tokens: int) -> int:
        t = self.ctx.table
        return max(0, -(-tokens // self.pool.block_size) - int(t.blocks[rid]))

    def _grow(self, rid: int, nb: int) -> None:
        self.pool.allocate(nb)
        self.ctx.table.blocks[rid] += nb

    def _preempt(self, rid: int) -> None:
        t = self.ctx.table
        self.pool.free(int(t.blocks[rid]))
        t.blocks[rid] = 0
        t.computed[rid] = 0
        t.preemptions[rid] += 1
        self.num_preemptions += 1
        self.waiting.appendleft(rid)

    # -- the engine process ---------------------------------------------------------------
    def run(self):
        env, rec = self.ctx.env, self.ctx.recorder
        while True:
            if not self.running and not self.waiting:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                self.clock = max(self.clock, env.now)
                continue
            if self.cfg.leap and self._leap_ok():
                k = self._leap()
                if k:
                    yield env.timeout(max(0.0, self.clock - env.now))
                    continue
            ids, n = self._schedule()
            if len(ids) == 0:
                raise RuntimeError(f"engine {self.index}: nothing schedulable with "
                                   f"{len(self.waiting)} waiting; KV pool too small?")
            shape, sample = self._shape(ids, n)
            self.clock += self.cost.step_s(shape)
            rec.num_iterations += 1
            rec.num_steps_scheduled += 1
            yield env.timeout(max(0.0, self.clock - env.now))
            self._apply(ids, n, sample)

    def _schedule(self) -> tuple[np.ndarray, np.ndarray]:
        ids, n, preempted = self._schedule_running()
        if not preempted:
            ids, n = self._admit(ids, n)
        return ids, n

    def _shape(self, ids: np.ndarray, n: np.ndarray) -> tuple[BatchShape, np.ndarray]:
        t = self.ctx.table
        c = t.computed[ids]
        ntok = t.num_tokens[ids]
        dec = (n == 1) & (c == ntok - 1) & (t.generated[ids] > 0)
        pre = ~dec
        sample = (c + n) == ntok
        shape = BatchShape(
            num_tokens=int(n.sum()), prefill_chunks=n[pre], prefill_ctx=c[pre],
            num_decodes=int(dec.sum()), decode_ctx_sum=int((c[dec] + 1).sum()),
            num_sample_rows=int(sample.sum()), decode_ctx=c[dec] + 1)
        return shape, sample

    def _apply(self, ids: np.ndarray, n: np.ndarray, sample: np.ndarray) -> None:
        t = self.ctx.table
        t.computed[ids] += n
        done = t.emit(ids[sample], self.clock)
        if len(done):
            self._finish(done)
        self._sample()

    def _finish(self, done: np.ndarray) -> None:
        t = self.ctx.table
        self.pool.free(int(t.blocks[done].sum()))
        t.blocks[done] = 0
        gone = set(done.tolist())
        self.running = [r for r in self.running if r not in gone]

    def _sample(self) -> None:
        t = self.ctx.table
        self.ctx.recorder.sample(self.clock, self.index, len(self.running), len(self.waiting),
                                 self.pool.num_used, t.num_emitted)

    # -- event leaping --------------------------------------------------------------------
    def _leap_ok(self) -> bool:
        if not self.running or len(self.running) > self.budget:
            return False
        t = self.ctx.table
        ids = np.asarray(self.running)
        if np.any(t.computed[ids] != t.num_tokens[ids] - 1) or np.any(t.generated[ids] == 0):
            return False  # a prefill (or recompute) is in flight
        if not self.waiting:
            return True
        # the head must stay blocked for the whole leap: free blocks only shrink while decoding
        nb0 = int(np.maximum(0, -(-(t.computed[ids] + 1) // self.pool.block_size) - t.blocks[ids]).sum())
        return not self._head_admissible(len(ids), self.pool.num_free - nb0)

    def _leap(self) -> int:
        t, bs = self.ctx.table, self.pool.block_size
        ids = np.asarray(self.running)
        c = t.computed[ids]
        held = t.blocks[ids]
        kmax = int(min((t.output[ids] - t.generated[ids]).min(), LEAP_CAP))

        def new_blocks(k: int) -> int:
            return int(np.maximum(0, -(-(c + k) // bs) - held).sum())

        free = self.pool.num_free
        kmax = largest_k(kmax, lambda k: new_blocks(k) <= free)
        if kmax < 2:
            return 0
        ends = decode_ends(self.cost, self.clock, c, kmax)
        k = steps_before(ends, kmax, self.ctx.source.next_arrival_s)
        if k < 2:
            return 0
        self.pool.allocate(new_blocks(k))
        t.blocks[ids] = np.maximum(held, -(-(c + k) // bs))
        t.computed[ids] += k
        t.emit_many(ids, ends[:k - 1])
        self.clock = float(ends[k - 1])
        done = t.emit(ids, self.clock)
        if len(done):
            self._finish(done)
        rec = self.ctx.recorder
        rec.num_iterations += k
        self._sample()
        return k

    # -- admission of waiting requests (FCFS, head-of-line blocking) -------------------------
    def _admit(self, ids, n):
        t = self.ctx.table
        left = self.budget - int(n.sum())
        new_ids, new_n = [], []
        while self.waiting and left > 0 and len(self.running) < self.max_seqs:
            r = self.waiting[0]
            k = min(int(t.num_tokens[r] - t.computed[r]), left)
            nb = self._admission_blocks(r, k)
            if not self.pool.can_allocate(nb):
                break
            self._grow(r, nb)
            self.waiting.popleft()
            self.running.append(r)
            new_ids.append(r)
            new_n.append(k)
            left -= k
        if not new_ids:
            return ids, n
        return (np.concatenate((ids, np.asarray(new_ids, dtype=np.int64))),
                np.concatenate((n, np.asarray(new_n, dtype=np.int64))))

    def _head_admissible(self, num_running: int, free_blocks: int) -> bool:
        """Would `_admit` take the head of the queue with this many running and free blocks?"""
        left = self.budget - num_running
        if left <= 0 or num_running >= self.max_seqs:
            return False
        t = self.ctx.table
        r = self.waiting[0]
        return self._admission_blocks(r, min(int(t.num_tokens[r] - t.computed[r]), left)) \
            <= free_blocks

    # -- policy-specific parts ------------------------------------------------------------
    def _admission_blocks(self, rid: int, chunk: int) -> int:
        """KV blocks to reserve when admitting `rid` with a first chunk of `chunk` tokens."""
        raise NotImplementedError

    def _schedule_running(self):
        raise NotImplementedError
