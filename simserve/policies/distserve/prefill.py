"""The prefill pool of `distserve`: whole prompts, batched, one batch at a time per instance.

A prompt's KV blocks are taken from the instance's pool when its batch starts and held until
its KV has been sent to the decode pool (back-pressure: a slow decode pool stalls prefill).
"""
from __future__ import annotations

import numpy as np

from simserve.cost import BatchShape, GpuCostModel
from simserve.policies.base import EngineBase, cost_model, kv_blocks
from simserve.policies.queues import make_queue
from simserve.policies.signal import Signal
from simserve.sim.kv import BlockPool


def make_pool(ctx, cfg, name: str, tp: int, max_tokens: int, max_seqs: int,
              blocks_override: int | None = None):
    blocks, kv = kv_blocks(ctx, "policy distserve", tp, cfg.gpu_memory_utilization,
                           cfg.block_size, max_tokens, max_seqs, blocks_override,
                           "use a larger TP degree", cuda_graphs=cfg.cuda_graphs,
                           graphs_counted=False)
    cost = cost_model(ctx, lambda: GpuCostModel(ctx.model, ctx.hardware.gpu, tp,
                                                ctx.hardware.nvlink, cfg.cuda_graphs,
                                                table_tokens=max(max_tokens, max_seqs)),
                      "policy distserve")
    return BlockPool(name, blocks, cfg.block_size), cost, dict(kv.summary(), num_gpu_blocks=blocks)


class PrefillInstance(EngineBase):
    def __init__(self, ctx, cfg, index: int, gpus: list[int], handoff):
        self.ctx, self.cfg, self.index, self.gpus = ctx, cfg, index, gpus
        self.budget = cfg.prefill_max_tokens
        self.pool, self.cost, self.kv_summary = make_pool(
            ctx, cfg, f"prefill{index}.gpu_kv", len(gpus), self.budget, cfg.max_num_seqs,
            cfg.prefill_blocks_override)
        self.waiting = make_queue(cfg.scheduler, ctx.table)
        self.num_in_batch = 0
        self.signal = Signal(ctx.env)   # an arrival, or blocks freed by a finished transfer
        self.handoff = handoff          # callable(rid, instance) once a prompt is prefilled

    def load(self) -> int:
        return len(self.waiting) + self.num_in_batch

    def enqueue(self, rid: int) -> None:
        self.waiting.append(rid)
        self.signal.fire()

    def release(self, rid: int) -> None:
        """The KV of `rid` has left for the decode pool."""
        t = self.ctx.table
        self.pool.free(self.pool.blocks_for(int(t.prompt[rid])))
        self.signal.fire()

    def _take_batch(self) -> list[int]:
        t, pool = self.ctx.table, self.pool
        batch, tokens = [], 0
        while self.waiting:
            r = self.waiting[0]
            p = int(t.prompt[r])
            if batch and tokens + p > self.budget:
                break
            if not pool.can_allocate(pool.blocks_for(p)):
                break
            pool.allocate(pool.blocks_for(p))
            batch.append(self.waiting.popleft())
            tokens += p
        return batch

    def run(self):
        env, t = self.ctx.env, self.ctx.table
        while True:
            batch = self._take_batch() if self.waiting else []
            if not batch:
                yield self.signal.wait()
                continue
            self.num_in_batch = len(batch)
            ids = np.asarray(batch, dtype=np.int64)
            p = t.prompt[ids]
            shape = BatchShape(num_tokens=int(p.sum()), prefill_chunks=p,
                               prefill_ctx=np.zeros(len(ids), dtype=np.int64),
                               num_sample_rows=len(ids))
            start = env.now
            yield env.timeout(self.cost.step_s(shape))
            if self.ctx.recorder.trace is not None:
                self.ctx.recorder.trace.iteration(
                    f"prefill instance {self.index} (GPU {','.join(map(str, self.gpus))})",
                    start, env.now, "prefill", prefill_tokens=shape.num_tokens,
                    prefill_chunks=p, decodes=0, kv_blocks_used=self.pool.num_used)
            self.ctx.recorder.num_iterations += 1
            self.ctx.recorder.num_steps_scheduled += 1
            t.computed[ids] = p
            self.num_in_batch = 0
            for r in batch:
                self.handoff(r, self)
