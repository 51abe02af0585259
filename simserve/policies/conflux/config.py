"""Parameters of the `conflux` policy (ConfluxServe §5–6, §8.1), with defaults and where they
came from."""
from __future__ import annotations

from dataclasses import dataclass

from simserve.policies.conflux.dispatch import DEFAULT_QUANTUM
from simserve.policies.conflux.placement import DEFAULT_ETA, DEFAULT_HEADROOM

SCHEDULERS = ("slo", "fcfs")


@dataclass(frozen=True, slots=True)
class ConfluxConfig:
    """`scheduler: slo` is full ConfluxServe (Moore–Hodgson admission, EDF then SJF backfill);
    `fcfs` is ConfluxServe-FCFS (the paper's execution-only comparison). The GPUs are split into
    `instances` XP instances; each has `num_gpus / instances / tp` logical ranks of TP `tp`."""

    instances: int = 1
    tp: int = 1                      # base TP per logical rank (§8.1: 1 for 8B/14B, 2 for 32B)
    scheduler: str = "slo"
    ttft_ms: float = 2000.0          # §8.1: 2 s / 100 ms for Qwen3-14B/32B (1 s / 50 ms for 8B)
    tbt_ms: float = 100.0            # τ: the TBT budget every iteration is dispatched against
    # contention factors of the split attention region; None: the GPU profile's measured
    # `overheads.sp_contention` (h200-sxm: α 1.0, β 1.72 from real SP2 runs, validation/) or,
    # without one, the paper's Fig. 14a value 1.28 (cost_sp.py)
    alpha: float | None = None
    beta: float | None = None
    # the split attention region overlaps prefill and decode attention (max of the two paths);
    # False runs them one after the other (their sum): Fig. 13's first ablation
    overlap: bool = True
    eta: float = DEFAULT_ETA         # dual-mode placement threshold (not given by the paper)
    headroom: float = DEFAULT_HEADROOM
    quantum: int = DEFAULT_QUANTUM   # water-level alignment q
    block_size: int = 16
    gpu_memory_utilization: float = 0.90  # vLLM 0.15.1's default (the paper's base)
    max_tokens_per_rank: int = 8192  # activation reserve basis and the highest water level tried
    num_gpu_blocks_override: int | None = None  # KV blocks per logical rank
    cuda_graphs: bool = True
    leap: bool = True                # exact event leaping over decode-only stretches

    def validate(self) -> None:
        for name in ("instances", "tp", "quantum", "block_size", "max_tokens_per_rank"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        v = self.num_gpu_blocks_override
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"num_gpu_blocks_override: expected a positive integer, got {v!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler: expected one of {', '.join(SCHEDULERS)}, "
                             f"got {self.scheduler!r}")
        for name in ("ttft_ms", "tbt_ms"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"{name}: expected a positive number, got {v!r}")
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if v is None:
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 1:
                raise ValueError(f"{name}: expected a contention factor >= 1, got {v!r}")
        if not 0 <= self.eta <= 1:
            raise ValueError(f"eta: expected a fraction in [0, 1], got {self.eta!r}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom: expected a fraction in [0, 1), got {self.headroom!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization: expected a number in (0, 1], got {u!r}")
