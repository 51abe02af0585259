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
from simserve.policies.chunked_config import ChunkedConfig
from simserve.policies.queues import check_scheduler, make_queue
from simserve.policies.replicas import build_replicas
from simserve.policies.vllm import VllmEngine


@dataclass(frozen=True, slots=True)
class ChunkedBaselineConfig(ChunkedConfig):
    """`vllm`'s parameters plus the waiting order. Defaults differ from `vllm`'s: tp None means
    one TP group over all GPUs (the paper's TP4 / TP8), and the paper's vLLM v0.15.1."""

    tp: int | None = None
    vllm_version: str = "0.15.1"
    scheduler: str = "fcfs"  # or "srpt" (ConfluxServe's "++" variants)

    def validate(self) -> None:
        ChunkedConfig.validate(dataclasses.replace(self, tp=self.tp or 1))
        check_scheduler(self.scheduler)


class ChunkedBaselineEngine(VllmEngine):
    kind = "chunked"

    def __init__(self, ctx, cfg, index, gpus):
        super().__init__(ctx, cfg, index, gpus)
        self.waiting = make_queue(cfg.scheduler, ctx.table)


@register("chunked", ChunkedBaselineConfig)
def build(ctx, cfg: ChunkedBaselineConfig):
    if cfg.tp is None:
        cfg = dataclasses.replace(cfg, tp=ctx.hardware.num_gpus)
    return build_replicas(ctx, cfg, ChunkedBaselineEngine)
