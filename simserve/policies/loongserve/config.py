"""Parameters of the `loongserve` policy (policies.md §4; LoongServe's router defaults)."""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULERS = ("fcfs", "srpt")


@dataclass(frozen=True, slots=True)
class LoongServeConfig:
    """Elastic sequence parallelism over `num_gpus / tp` instances of TP `tp`, prefill SP degree
    at most `max_sp` (ConfluxServe §8.1: TP1 × SP4 for 8B/14B, TP2 × SP4 for 32B).
    `scheduler: fcfs` is LoongServe as released (FCFS with head-of-line blocking); `srpt` is
    LoongServe++ (fewest remaining prefill tokens first, ConfluxServe §8.1)."""

    # TP degree of one instance (an SP rank); num_gpus / tp instances (§8.1: 1 for 8B/14B, 2
    # for 32B)
    tp: int = 1
    # highest SP degree of a prefill (degrees tried: powers of two up to it and the instance
    # count; §8.1: SP4)
    max_sp: int = 4
    # "fcfs": LoongServe as released (head-of-line blocking); "srpt": LoongServe++, fewest
    # remaining prefill tokens first (ConfluxServe §8.1)
    scheduler: str = "fcfs"
    max_wait_tokens: int = 10           # decode iterations before a prefill is tried again
    max_prefill_time_ms: float = 500.0  # a batch of more than one prompt must finish within this
    # most prompt tokens in one prefill batch; None: max(1/6 of all KV slots, longest prompt)
    batch_max_tokens: int | None = None
    max_new_tokens_reserve: int = 1024   # router_max_new_token_len: output assumed for KV checks
    # Not LoongServe: cap each prefill iteration so that it plus one decode step fits this TBT
    # (prompts are then prefilled in pieces). Used for the TBT-bounded Table 2 setting only.
    tbt_ms: float | None = None
    # Not LoongServe's elastic rule: run every prefill at this SP degree, lending decode
    # instances as needed (ConfluxServe Fig. 6 / Table 2 run LoongServe's prefill at SP4)
    prefill_sp: int | None = None
    block_size: int = 16                # tokens per KV block
    # share of HBM for weights, activations and KV: assumed the 0.90 of the other ConfluxServe
    # baselines (vLLM 0.15.1's default); LoongServe's own memory setting is not modelled
    gpu_memory_utilization: float = 0.90
    num_gpu_blocks_override: int | None = None  # KV blocks per instance
    # piecewise CUDA graphs (ConfluxServe §8.1): iterations of at most the GPU profile's
    # `graph_max_tokens` tokens are priced as a graph replay; False: all eager
    cuda_graphs: bool = True

    def validate(self) -> None:
        for name in ("tp", "max_sp", "max_wait_tokens", "max_new_tokens_reserve", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        for name in ("batch_max_tokens", "num_gpu_blocks_override", "prefill_sp"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        if self.prefill_sp is not None and self.prefill_sp > self.max_sp:
            raise ValueError(f"prefill_sp: {self.prefill_sp} exceeds max_sp={self.max_sp}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler: expected one of {', '.join(SCHEDULERS)}, "
                             f"got {self.scheduler!r}")
        for name in ("max_prefill_time_ms", "tbt_ms"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or not v > 0):
                raise ValueError(f"{name}: expected a positive number, got {v!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization: expected a number in (0, 1], got {u!r}")
