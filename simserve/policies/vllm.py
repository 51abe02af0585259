"""Policy `vllm`: the vLLM V1 scheduler with chunked prefill (policies.md §2).

Running requests first, in admission order, each given the tokens that catch it up (1 for a
decode, the rest of a prompt for a partial prefill) within the token budget; a request whose
blocks do not fit preempts the newest running request (recompute: all its KV freed, back to
the front of the waiting queue); then, only if nothing was preempted, waiting requests FCFS
while the budget, `max_num_seqs` and the KV pool allow (head-of-line blocking,
`ChunkedScheduler.admit`). KV is allocated incrementally, block by block. The engine runtime
that runs it is `vllm_engine.py`.
"""
from __future__ import annotations

import numpy as np

from simserve.policies import register
from simserve.policies.vllm_engine import chunked_replicas
from simserve.policies.vllm_engine_config import ChunkedConfig
from simserve.policies.vllm_scheduler import ChunkedScheduler

_EMPTY = np.zeros(0, dtype=np.int64)


def _running_fit(comp, blocks, ntok, run: list, budget: int, bs: int, free: int):
    """`VllmScheduler.schedule_running`'s loop: each running request's tokens this step (its
    need, within what the budget leaves after the earlier ones) and the KV blocks they take. If
    the blocks fit in `free`, writes the new block counts and returns (tokens per request,
    blocks taken, whether every request got some); else None and nothing is written.
    Memoryviews of the request table's arrays; C arrays when compiled (vllm.pxd)."""
    out_n, nbs = [], []
    left = budget  # budget less every earlier request's need
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


class VllmScheduler(ChunkedScheduler):
    """vLLM V1's decisions (`ChunkedScheduler`'s admission, default leap bound)."""

    kind = "vllm"
    leap_checked = True  # the default `leap_bound` holds for these decisions

    def schedule_running(self, s):
        """Each running request's tokens: `_running_fit` while every one's blocks fit (the
        common case, a typed loop), else the reference loop `_running_preempting`, which
        gives the same result when nothing is preempted (tests hold the two together)."""
        if not s.running:
            return _EMPTY, _EMPTY, False
        kv = s.kv
        comp, blocks, ntok, _, _ = kv.views
        plan = _running_fit(comp, blocks, ntok, s.running, s.budget, kv.pool.block_size,
                            kv.pool.num_free)
        if plan is None:
            return self._running_preempting(s)
        out_n, total, keep = plan
        kv.pool.allocate(total)
        if keep:
            return list(s.running), out_n, False
        return ([r for r, k in zip(s.running, out_n) if k > 0], [k for k in out_n if k > 0],
                False)

    def _running_preempting(self, s):
        """The reference loop: victims (`victim`) are preempted until the next request's
        blocks fit; a victim already scheduled this step gives its tokens back."""
        kv, run, comp, ntok = s.kv, s.running, s.kv.views[0], s.kv.views[2]
        budget = s.budget
        out_ids, out_n = [], []
        preempted = False
        i = 0
        while i < len(run) and budget > 0:
            r = run[i]
            n = min(ntok[r] - comp[r], budget)
            while True:
                nb = kv.blocks_needed(r, comp[r] + n)
                if kv.pool.can_allocate(nb):
                    kv.grow(r, nb)
                    break
                victim = self.victim(s)
                j = run.index(victim)
                s.preempt(victim)
                preempted = True
                if victim == r:
                    r = None
                    break
                if j < i:  # scheduled already: its tokens go back to the budget
                    budget += out_n.pop(j)
                    out_ids.pop(j)
                    i -= 1
            if r is None:
                break
            out_ids.append(r)
            out_n.append(n)
            budget -= n
            i += 1
        return (np.asarray(out_ids, dtype=np.int64), np.asarray(out_n, dtype=np.int64), preempted)


@register("vllm", ChunkedConfig)
def build(ctx, cfg: ChunkedConfig):
    return chunked_replicas(ctx, cfg, VllmScheduler)
