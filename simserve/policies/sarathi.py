"""Policy `sarathi`: Sarathi-Serve's stall-free batching (policies.md §3).

Decodes first (a decode that cannot grow preempts the tail of the running list, itself last),
then running partial prefills, then new prompts FCFS, each admitted only if the KV of its
whole prompt can be reserved at admission. The token budget (`max_num_batched_tokens`, the
paper's chunk size: 512 strict / 2048 relaxed SLO) counts decodes too.
"""
from __future__ import annotations

import numpy as np

from simserve.policies import register
from simserve.policies.vllm_engine import chunked_replicas
from simserve.policies.vllm_engine_config import ChunkedConfig
from simserve.policies.vllm_scheduler import ChunkedScheduler

_EMPTY = np.zeros(0, dtype=np.int64)


class SarathiScheduler(ChunkedScheduler):
    kind = "sarathi"
    leap_checked = True  # the default `leap_bound` holds for these decisions
    # Sarathi-Serve's own system has no automatic prefix caching; `enable_prefix_caching:
    # true` turns on the shared pool's (vLLM's) cache for it
    prefix_caching_default = False

    def schedule_running(self, s):
        if not s.running:
            return _EMPTY, _EMPTY, False
        t, pool = s.table, s.kv.pool
        bs = pool.block_size
        ids = np.asarray(s.running, dtype=np.int64)
        dec = (t.computed[ids] == t.num_tokens[ids] - 1) & (t.generated[ids] > 0)
        d_ids = ids[dec]
        nb = np.maximum(0, -(-(t.computed[d_ids] + 1) // bs) - t.blocks[d_ids])
        preempted = False
        if int(nb.sum()) <= pool.num_free:
            pool.allocate(int(nb.sum()))
            t.blocks[d_ids] += nb
        else:
            d_ids, preempted = self._decodes_preempting(s, d_ids)
        used = len(d_ids)
        # partial prefills (their prompt's KV was reserved at admission)
        p_ids, p_n = [], []
        for r in s.running:
            if used >= s.budget:
                break
            rem = int(t.num_tokens[r] - t.computed[r])
            if rem > 1 or t.generated[r] == 0:
                k = min(rem, s.budget - used)
                p_ids.append(r)
                p_n.append(k)
                used += k
        ids = np.concatenate((d_ids, np.asarray(p_ids, dtype=np.int64)))
        n = np.concatenate((np.ones(len(d_ids), dtype=np.int64), np.asarray(p_n, dtype=np.int64)))
        return ids, n, preempted

    def _decodes_preempting(self, s, d_ids: np.ndarray):
        """Each decode's block in turn, preempting victims (`victim`) until it fits."""
        kv, comp = s.kv, s.kv.views[0]
        out, preempted = [], False
        for r in d_ids.tolist():
            if r not in s.running:
                continue  # preempted earlier in this pass
            nb = kv.blocks_needed(r, comp[r] + 1)
            while not kv.pool.can_allocate(nb):
                victim = self.victim(s)
                if victim in out:
                    out.remove(victim)  # scheduled already: its block was freed with it
                s.preempt(victim)
                preempted = True
                if victim == r:
                    break
            else:
                kv.grow(r, nb)
                out.append(r)
        return np.asarray(out, dtype=np.int64), preempted

    def admission_blocks(self, s, rid: int, chunk: int) -> int:
        # reserve the whole prompt (plus outputs to recompute after a preemption) at once
        return s.kv.blocks_needed(rid, s.kv.views[2][rid])


@register("sarathi", ChunkedConfig)
def build(ctx, cfg: ChunkedConfig):
    return chunked_replicas(ctx, cfg, SarathiScheduler)
