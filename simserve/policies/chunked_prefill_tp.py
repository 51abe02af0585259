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
from simserve.policies.replicas import build_replicas
from simserve.policies.vllm import VllmEngine


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


class ChunkedBaselineEngine(VllmEngine):
    """Under SRPT the token budget goes to prefills in order of remaining prompt tokens across
    running and waiting requests: before vLLM's loop, running requests are ordered decodes
    first, then partial prefills shortest-remaining first (so the longest is also the first
    preemption victim), and a waiting request with fewer remaining tokens than a running
    partial prefill is moved ahead of it when the pool can hold its whole prompt (so the
    promotion itself never forces a preemption)."""

    kind = "chunked"

    def __init__(self, ctx, cfg, index, gpus):
        super().__init__(ctx, cfg, index, gpus)
        self.waiting = make_queue(cfg.scheduler, ctx.table)
        self.srpt = cfg.scheduler == "srpt"

    def _schedule(self):
        if self.srpt and self.running:
            self._srpt_order()
        return super()._schedule()

    def _srpt_order(self) -> None:
        t = self.ctx.table
        left = lambda r: int(t.num_tokens[r] - t.computed[r])  # noqa: E731
        self.running.sort(key=left)  # stable: decodes (1 token left) keep their order
        longest = left(self.running[-1])
        free = self.pool.num_free
        while (self.waiting and len(self.running) < self.max_seqs and longest > 1
               and left(self.waiting[0]) < longest):
            r = self.waiting[0]
            if self.pc is not None:  # prefix caching: it claims its cached prefix first
                hashes, h, p, e = self._lookup(r)
                need = -(-int(t.num_tokens[r]) // self.pool.block_size) - h - p + e
                if need > free:
                    break
                self._claim_prefix(r, hashes, h, p)
                free -= need
                self.running.append(self.waiting.popleft())
                self.running.sort(key=left)
                longest = left(self.running[-1])
                continue
            need = self._blocks_needed(r, int(t.num_tokens[r]))
            if need > free:
                break
            free -= need
            self.running.append(self.waiting.popleft())
            self.running.sort(key=left)
            longest = left(self.running[-1])


@register("chunked", ChunkedBaselineConfig)
def build(ctx, cfg: ChunkedBaselineConfig):
    if cfg.tp is None:
        cfg = dataclasses.replace(cfg, tp=ctx.hardware.num_gpus)
    return build_replicas(ctx, cfg, ChunkedBaselineEngine)
