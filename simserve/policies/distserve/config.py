"""Parameters of `distserve` (policies.md §6; ConfluxServe §8.1)."""
from __future__ import annotations

from dataclasses import dataclass

from simserve.policies.queues import check_scheduler


@dataclass(frozen=True, slots=True)
class DistServeConfig:
    """None means "half of the GPUs" for the TP degrees (the paper's best 1:1 split)."""

    # TP degree of each prefill instance; the first half of the GPUs holds half / prefill_tp
    # of them. None: half the GPUs, one instance (ConfluxServe §8.1: TP2 + TP2 on 4 GPUs)
    prefill_tp: int | None = None
    # TP degree of each decode instance, on the second half of the GPUs; None: half the GPUs
    decode_tp: int | None = None
    # whole prompts are batched FCFS up to this many tokens (a longer prompt runs alone):
    # vLLM's API-server token budget on >= 70 GiB GPUs (`EngineArgs.get_batch_defaults`),
    # which the paper's vLLM prefill instance runs with
    prefill_max_tokens: int = 8192
    max_num_seqs: int = 1024          # decode batch cap (vLLM default on H100)
    scheduler: str = "fcfs"           # prefill queue order; "srpt" is DistServe++
    # share of HBM for weights, activations and KV: vLLM v0.15.1's default (vllm/config/cache.py)
    gpu_memory_utilization: float = 0.90
    block_size: int = 16              # tokens per KV block
    # iterations of at most the GPU profile's `graph_max_tokens` tokens are priced as a
    # CUDA-graph replay, longer ones as eager launches; False: all eager
    cuda_graphs: bool = True
    leap: bool = True  # decode pool: exact event leaping; False steps one by one
    prefill_blocks_override: int | None = None  # KV blocks per prefill instance (replaces the pool)
    decode_blocks_override: int | None = None   # KV blocks per decode instance (replaces the pool)
    # a decode pool of its own (heterogeneous disaggregation): the GPU profile it runs on
    # (e.g. h20); then hardware.num_gpus are all prefill GPUs and decode_num_gpus (default:
    # as many) decode GPUs on other nodes, the KV hand-off crossing `handoff_link`. None: the
    # decode pool is the second half of hardware.num_gpus, hand-off over NVLink
    decode_gpu: str | None = None
    decode_num_gpus: int | None = None   # GPUs of the decode pool (needs decode_gpu)
    handoff_link: str = "ib-ndr400"      # link profile between the pools, when decode_gpu is set

    def validate(self) -> None:
        for name in ("prefill_tp", "decode_tp", "prefill_blocks_override",
                     "decode_blocks_override", "decode_num_gpus"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        for name in ("prefill_max_tokens", "max_num_seqs", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization: expected a number in (0, 1], got {u!r}")
        check_scheduler(self.scheduler)
        if self.decode_gpu is not None:
            _profile("decode_gpu", self.decode_gpu, "gpu")
            _profile("handoff_link", self.handoff_link, "link")
            if self.decode_num_gpus and self.decode_tp and self.decode_num_gpus % self.decode_tp:
                raise ValueError(f"decode_tp: {self.decode_tp} does not divide the "
                                 f"{self.decode_num_gpus} GPUs of the decode pool")
        if self.decode_num_gpus is not None and self.decode_gpu is None:
            raise ValueError("decode_num_gpus: needs decode_gpu (the decode pool's GPU kind; "
                             "name the same kind as hardware.gpu for a same-kind pool)")


def _profile(field: str, name, kind: str) -> None:
    from simserve.errors import ConfigError
    from simserve.hardware.profile import load_profile
    if not isinstance(name, str) or not name:
        raise ValueError(f"{field}: expected a {kind} profile name, got {name!r}")
    try:
        load_profile(name, expect_kind=kind)
    except ConfigError as exc:
        raise ValueError(f"{field}: {exc}") from None
