"""Parameters of `muxwise` (policies.md §5; ConfluxServe §8.1), with where defaults come from."""
from __future__ import annotations

from dataclasses import dataclass

from simserve.policies.queues import check_scheduler


@dataclass(frozen=True, slots=True)
class MuxWiseConfig:
    tp: int | None = None               # TP degree; None: one TP group over all GPUs (TP4 / TP8)
    tbt_ms: float = 100.0               # the TBT SLO decode's SM share must meet
    # alpha: slowdown of decode co-running with prefill on disjoint SMs. None: the GPU
    # profile's measured `overheads.sm_share` curves (h200-sxm, and h100-sxm carried over:
    # alpha 1.19-1.23, beta 1.08-1.13 from green-context runs, hwprofiles/raw/h200-sxm/smshare),
    # else ConfluxServe Fig. 14a's 1.28 (smshare.CONTENTION_FIG14A; the paper calls MuxWise's
    # interference "higher and less stable" but reports no number). A number overrides.
    decode_contention: float | None = None
    # beta: slowdown of prefill co-running with decode; None as for decode_contention
    prefill_contention: float | None = None
    # SM groups as SGLang's pdmux `divide_sm`: decode gets multiples of `sm_granularity` SMs
    # (8 on Hopper), at least `min_decode_sms` (16) and at most half the SMs; a phase running
    # alone gets every SM
    sm_granularity: int = 8
    min_decode_sms: int = 16            # fewest SMs decode gets beside a prefill (SGLang: 16)
    # How kernel time scales with the SM share. None: the profile's measured curves of memory
    # and compute throughput vs SM share (`overheads.sm_share`), else the analytic model with
    # HBM saturating at half the SMs. A number f_sat forces the analytic model: bandwidth
    # min(1, share / f_sat), compute proportional to the share.
    bw_saturation: float | None = None
    prefill_max_tokens: int = 16384     # SGLang's default max_prefill_tokens; whole prompts
    # sampler rows assumed in the activation reserve and the cost tables' range (SGLang's
    # max_running_requests is not modelled: the decode batch is limited by KV only)
    max_num_seqs: int = 1024
    scheduler: str = "fcfs"             # "srpt" is MuxWise++ (MuxWise-FCFS: no preemption)
    # share of HBM for weights, activations and KV: assumed the 0.90 of the other ConfluxServe
    # baselines (vLLM 0.15.1's default); SGLang's mem_fraction_static is not modelled
    gpu_memory_utilization: float = 0.90
    block_size: int = 16                # tokens per KV block
    # iterations of at most the GPU profile's `graph_max_tokens` tokens are priced as a
    # CUDA-graph replay, longer ones as eager launches; False: all eager
    cuda_graphs: bool = True
    num_gpu_blocks_override: int | None = None  # KV blocks per instance (tests)
    leap: bool = True  # exact event leaping over decode-only steps; False steps one by one

    def validate(self) -> None:
        for name in ("tp", "num_gpu_blocks_override"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        for name in ("tbt_ms",):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name}: expected a positive number, got {v!r}")
        for name in ("decode_contention", "prefill_contention"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                                  or not v >= 1):
                raise ValueError(f"{name}: expected a slowdown factor >= 1, got {v!r}")
        for name in ("sm_granularity", "min_decode_sms", "prefill_max_tokens", "max_num_seqs",
                     "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        b = self.bw_saturation
        if b is not None and (not isinstance(b, (int, float)) or isinstance(b, bool)
                              or not 0 < b <= 1):
            raise ValueError(f"bw_saturation: expected a fraction in (0, 1], got {self.bw_saturation!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization: expected a number in (0, 1], got {u!r}")
        check_scheduler(self.scheduler)

    def decode_sm_choices(self, total_sms: int) -> list[int]:
        """Decode SM counts of the mixed groups, smallest first."""
        out = list(range(self.min_decode_sms, total_sms // 2 + 1, self.sm_granularity))
        if not out:
            raise ValueError(f"min_decode_sms: {self.min_decode_sms} is more than half of the "
                             f"GPU's {total_sms} SMs")
        return out
