"""Policy `vllm`: the vLLM V1 scheduler with chunked prefill (see `vllm_engine.py` for the loop)."""
from __future__ import annotations

import numpy as np

from simserve.policies import register
from simserve.policies.vllm_engine import SMALL_BATCH, ChunkedEngine
from simserve.policies.vllm_engine_config import ChunkedConfig
from simserve.policies.replicas import build_replicas

_EMPTY = np.zeros(0, dtype=np.int64)


def _running_fit(comp, blocks, ntok, run: list, budget: int, bs: int, free: int):
    """`_schedule_running_small`'s loop: each running request's tokens this step (its need,
    within what the budget leaves after the earlier ones) and the KV blocks they take. If
    the blocks fit in `free`, writes the new block counts and returns (tokens per request,
    blocks taken, whether every request got some); else None and nothing is written.
    Memoryviews of the request table's arrays; C arrays when compiled (vllm.pxd)."""
    out_n, nbs = [], []
    left = budget  # budget less every earlier request's need (the cumsum in the numpy path)
    total, keep = 0, True
    for i in range(len(run)):
        r = run[i]
        x = comp[r]
        need = ntok[r] - x
        n = need if need < left else (left if left > 0 else 0)
        left -= need
        nb = 0
        if n > 0:
            nb = -(-(x + n) // bs) - blocks[r]
            if nb < 0:
                nb = 0
        else:
            keep = False
        out_n.append(n)
        nbs.append(nb)
        total += nb
    if total > free:
        return None
    if total:
        for i in range(len(run)):
            nb = nbs[i]
            if nb:
                blocks[run[i]] += nb
    return out_n, total, keep


class VllmEngine(ChunkedEngine):
    kind = "vllm"

    def _schedule_running(self):
        if not self.running:
            return _EMPTY, _EMPTY, False
        t, bs = self.ctx.table, self.pool.block_size
        if len(self.running) <= SMALL_BATCH:
            return self._schedule_running_small(bs)
        ids = np.asarray(self.running, dtype=np.int64)
        need = t.num_tokens[ids] - t.computed[ids]
        n = np.clip(self.budget - (np.cumsum(need) - need), 0, need)
        nb = np.where(n > 0, np.maximum(0, -(-(t.computed[ids] + n) // bs) - t.blocks[ids]), 0)
        total = int(nb.sum())
        if total <= self.pool.num_free:  # common case: everyone fits, nobody is preempted
            keep = n > 0
            self.pool.allocate(total)
            t.blocks[ids] += nb
            return ids[keep], n[keep], False
        return self._schedule_running_slow()

    def _schedule_running_small(self, bs: int):
        """The vectorised common case above on plain ints (a small batch: numpy calls cost
        more than the arithmetic); the same decisions, the batch as lists."""
        comp, blocks, ntok, _, _ = self._views
        plan = _running_fit(comp, blocks, ntok, self.running, self.budget, bs,
                            self.pool.num_free)
        if plan is None:
            return self._schedule_running_slow()
        out_n, total, keep = plan
        self.pool.allocate(total)
        if keep:
            return list(self.running), out_n, False
        return ([r for r, k in zip(self.running, out_n) if k > 0], [k for k in out_n if k > 0],
                False)

    def _schedule_running_slow(self):
        """The reference loop: newest running requests are preempted until the next fits."""
        t = self.ctx.table
        run = self.running
        budget = self.budget
        out_ids, out_n = [], []
        preempted = False
        i = 0
        while i < len(run) and budget > 0:
            r = run[i]
            n = min(int(t.num_tokens[r] - t.computed[r]), budget)
            while True:
                nb = self._blocks_needed(r, int(t.computed[r]) + n)
                if self.pool.can_allocate(nb):
                    self._grow(r, nb)
                    break
                victim = run.pop()
                self._preempt(victim)
                preempted = True
                if victim == r:
                    r = None
                    break
            if r is None:
                break
            out_ids.append(r)
            out_n.append(n)
            budget -= n
            i += 1
        return (np.asarray(out_ids, dtype=np.int64), np.asarray(out_n, dtype=np.int64), preempted)

    def _admission_blocks(self, rid: int, chunk: int) -> int:
        # incremental allocation: only the first chunk's blocks
        return self._blocks_needed(rid, self._views[0][rid] + chunk)


@register("vllm", ChunkedConfig)
def build(ctx, cfg: ChunkedConfig):
    return build_replicas(ctx, cfg, VllmEngine)
