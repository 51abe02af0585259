"""Policy `sarathi`: Sarathi-Serve's stall-free batching (policies.md §3).

Decodes first (a decode that cannot grow preempts the tail of the running list, itself last),
then running partial prefills, then new prompts FCFS, each admitted only if the KV of its
whole prompt can be reserved at admission. The token budget (`max_num_batched_tokens`, the
paper's chunk size: 512 strict / 2048 relaxed SLO) counts decodes too.
"""
from __future__ import annotations

import numpy as np

from simserve.policies import register
from simserve.policies.vllm_engine import ChunkedEngine
from simserve.policies.vllm_engine_config import ChunkedConfig
from simserve.policies.replicas import build_replicas

_EMPTY = np.zeros(0, dtype=np.int64)


class SarathiEngine(ChunkedEngine):
    kind = "sarathi"
    # Sarathi-Serve's own system has no automatic prefix caching; `enable_prefix_caching:
    # true` turns on the shared pool's (vLLM's) cache for it
    prefix_caching_default = False

    def _schedule_running(self):
        if not self.running:
            return _EMPTY, _EMPTY, False
        t, bs = self.ctx.table, self.pool.block_size
        ids = np.asarray(self.running, dtype=np.int64)
        dec = (t.computed[ids] == t.num_tokens[ids] - 1) & (t.generated[ids] > 0)
        d_ids = ids[dec]
        nb = np.maximum(0, -(-(t.computed[d_ids] + 1) // bs) - t.blocks[d_ids])
        preempted = False
        if int(nb.sum()) <= self.pool.num_free:
            self.pool.allocate(int(nb.sum()))
            t.blocks[d_ids] += nb
        else:
            d_ids, preempted = self._decodes_slow(d_ids)
        used = len(d_ids)
        # partial prefills (their prompt's KV was reserved at admission)
        p_ids, p_n = [], []
        for r in self.running:
            if used >= self.budget:
                break
            rem = int(t.num_tokens[r] - t.computed[r])
            if rem > 1 or t.generated[r] == 0:
                k = min(rem, self.budget - used)
                p_ids.append(r)
                p_n.append(k)
                used += k
        ids = np.concatenate((d_ids, np.asarray(p_ids, dtype=np.int64)))
        n = np.concatenate((np.ones(len(d_ids), dtype=np.int64), np.asarray(p_n, dtype=np.int64)))
        return ids, n, preempted

    def _decodes_slow(self, d_ids: np.ndarray):
        t = self.ctx.table
        out, preempted = [], False
        for r in d_ids.tolist():
            if r not in self.running:
                continue  # preempted earlier in this pass
            nb = self._blocks_needed(r, int(t.computed[r]) + 1)
            while not self.pool.can_allocate(nb):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim == r:
                    break
            else:
                self._grow(r, nb)
                out.append(r)
        return np.asarray(out, dtype=np.int64), preempted

    def _admission_blocks(self, rid: int, chunk: int) -> int:
        # reserve the whole prompt (plus outputs to recompute after a preemption) at once
        return self._blocks_needed(rid, int(self.ctx.table.num_tokens[rid]))


@register("sarathi", ChunkedConfig)
def build(ctx, cfg: ChunkedConfig):
    return build_replicas(ctx, cfg, SarathiEngine)
