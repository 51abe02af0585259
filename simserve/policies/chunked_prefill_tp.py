"""Policy `chunked`: ConfluxServe's Chunked Prefill baseline (§8.1).

vLLM's chunked-prefill engine (the `vllm` policy, same loop and cost model) over one TP group
spanning every GPU of the instance (TP4 for Llama-8B / Qwen-14B, TP8 for Qwen-32B), with the
paper's vLLM version (v0.15.1) and an optional SRPT waiting order ("Chunked++": the fewest
remaining prefill tokens first). With `scheduler: fcfs` it is exactly `vllm`. The paper sweeps
the token budget per model/workload/TBT and keeps the best: sweep `max_num_batched_tokens`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simserve.policies import register
from simserve.policies.vllm_engine_config import ChunkedConfig
from simserve.policies.queues import check_scheduler, make_queue
from simserve.policies.vllm import VllmScheduler
from simserve.policies.vllm_engine import chunked_replicas


@dataclass(frozen=True, slots=True)
class ChunkedBaselineConfig(ChunkedConfig):
    """`vllm`'s parameters plus the waiting order. Defaults differ from `vllm`'s: tp None means
    one TP group over all GPUs (the paper's TP4 / TP8), and the paper's vLLM v0.15.1."""

    tp: int | None = None  # TP degree; None: one TP group over all GPUs (§8.1: TP4 / TP8)
    vllm_version: str = "0.15.1"  # the paper's vLLM (§8.1), whose defaults apply (util 0.90)
    # waiting order: "fcfs" (vLLM's) or "srpt", fewest remaining prefill tokens first
    # (ConfluxServe's "++" variants, §8.1)
    scheduler: str = "fcfs"

    def validate(self) -> None:
        ChunkedConfig.validate(dataclasses.replace(self, tp=self.tp or 1))
        check_scheduler(self.scheduler)


class ChunkedBaselineScheduler(VllmScheduler):
    """Under SRPT the token budget goes to prefills in order of remaining prompt tokens across
    running and waiting requests: before vLLM's loop, running requests are ordered decodes
    first, then partial prefills shortest-remaining first (so the longest is also the first
    preemption victim), and a waiting request with fewer remaining tokens than a running
    partial prefill is moved ahead of it when the pool can hold its whole prompt (so the
    promotion itself never forces a preemption). A leap needs every running request
    decoding, when there is nothing to reorder: vLLM's bound holds."""

    kind = "chunked"
    leap_checked = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.srpt = cfg.scheduler == "srpt"

    def waiting_queue(self, table):
        return make_queue(self.cfg.scheduler, table)

    def schedule_running(self, s):
        if self.srpt and s.running:
            self._srpt_order(s)
        return super().schedule_running(s)

    def _srpt_order(self, s) -> None:
        t, kv = s.table, s.kv
        left = lambda r: int(t.num_tokens[r] - t.computed[r])  # noqa: E731
        s.running.sort(key=left)  # stable: decodes (1 token left) keep their order
        longest = left(s.running[-1])
        free = kv.pool.num_free
        while (s.waiting and len(s.running) < s.max_seqs and longest > 1
               and left(s.waiting[0]) < longest):
            r = s.waiting[0]
            if kv.pc is not None:  # prefix caching: it claims its cached prefix first
                hashes, h, p, e = kv.lookup(r)
                need = -(-int(t.num_tokens[r]) // kv.pool.block_size) - h - p + e
                if need > free:
                    break
                kv.claim_prefix(r, hashes, h, p)
            else:
                need = kv.blocks_needed(r, int(t.num_tokens[r]))
                if need > free:
                    break
            free -= need
            s.running.append(s.waiting.popleft())
            s.running.sort(key=left)
            longest = left(s.running[-1])


@register("chunked", ChunkedBaselineConfig)
def build(ctx, cfg: ChunkedBaselineConfig):
    if cfg.tp is None:
        cfg = dataclasses.replace(cfg, tp=ctx.hardware.num_gpus)
    return chunked_replicas(ctx, cfg, ChunkedBaselineScheduler)
