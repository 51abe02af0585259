"""Parameters of the `dualpace` policy (DualPace §4, App. A–B), with where each default
comes from. None means "derive it from the hardware profile at build time" (§4.3)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class DualPaceConfig:
    NEEDS_HARDWARE: ClassVar[tuple[str, ...]] = ("cpu", "cpu_cores")  # checked before a run

    # -- host tier -------------------------------------------------------------------------
    # Host KV pool, GiB in all (aggregate over CPU TP ranks). The paper does not state the size
    # of its main runs; Fig. 11b sweeps 30-240 GiB and finds throughput and TTFT plateau from
    # 120 GiB on (§6.4), and NEO's A10 config uses 120 GB of swap space: 120 is the default.
    host_kv_gib: float = 120.0
    cpu_tp: int = 1                   # CPU TP ranks of cores/cpu_tp cores each (§5, Fig. 11a)
    # -- profile-guided controls (§4.3; advisory, overridable) ---------------------------------
    # C, most decodes in one CPU-engine batch; None: the CPU profile's throughput-maximising
    # batch (256 on the Xeon Silver 4510, Fig. 7b)
    cpu_batch_limit: int | None = None
    # batched-token limit of a GPU round; None: the knee of the profiled per-layer throughput
    # (1024 on the RTX 4090)
    gpu_token_limit: int | None = None
    # Dense Assist routing thresholds (P, F) of Eq. 5 / Alg. 1, in CPU batch rows: Full-CPU
    # for b <= F, Split-Final for F < b <= P, Fused-Assist above P; (0, 0) or 0 <= F < P.
    # Both None: chosen by Alg. 1 from the profiles at build ((32, 16) on RTX 4090 + Xeon 4510)
    assist_p: int | None = None
    assist_f: int | None = None                 # F of (P, F): set both or neither (see assist_p)
    assist_eps: float = 0.0025                  # Alg. 1 regret tolerance (§4.3: 0.25 %)
    # λ_GPU, weight of the GPU disturbance D in Alg. 1's score S = T + λ·D (Eq. 6; §4.3: 1)
    assist_lambda: float = 1.0
    # host launch + finalise of one assist on the GPU worker's service path (µs); None: Fig.
    # 12's figure for the platform, `controls.assist_host_us` (300 on the 4090, 459 on H20)
    assist_host_us: float | None = None
    boundary_poll_us: float = 3.5     # empty assist poll per layer boundary (§6.4: 2-5 µs)
    # -- GPU engine ------------------------------------------------------------------------
    # The hard token limit is not given by the paper: vLLM 0.22.1's API-server budget on a
    # >= 70 GiB GPU (8192) is the default. A prompt longer than it runs alone (whole prompts).
    hard_token_limit: int = 8192
    # Whether prefills are chunked is not stated. NEO (the code base DualPace compares with and
    # whose Prefill-to-CPU it follows) runs whole prompts, with the profiled limit as a soft cap:
    # the first prompt of a round is always admitted (a judgement call: the paper does not say).
    chunked_prefill: bool = False
    max_num_seqs: int | None = None   # GPU row limit; None: vLLM 0.22.1's default for the GPU
    # share of the GPU's HBM for weights, activations and KV, as the vLLM 0.22.1 baseline
    gpu_memory_utilization: float = 0.92
    staging_tokens: int | None = None  # Prefill-to-CPU GPU staging per round; None: hard limit
    # "host decode-admission limit" of App. A.1 step 5, read as a cap on CPU-owned requests
    # (running + waiting) for Prefill-to-CPU admission; the paper gives no value: None = Eq. 2
    # only (e.g. set it to the CPU batch limit to keep the host backlog within one CPU batch)
    host_admission_limit: int | None = None
    block_size: int = 16              # tokens per KV block, GPU and host pools
    tp: int | None = None             # GPU TP degree; None: all GPUs (one GPU engine, §6.1)
    # iterations of at most the GPU profile's `graph_max_tokens` tokens are priced as a
    # CUDA-graph replay, longer ones as eager launches; False: all eager
    cuda_graphs: bool = True
    # GiB per GPU held back for activations before the GPU KV pool is sized; None: estimated
    # from the model's shapes at `hard_token_limit` (kv_budget.py)
    activation_reserve_gib: float | None = None
    num_gpu_blocks_override: int | None = None  # GPU KV blocks, replacing the computed pool
    num_cpu_blocks_override: int | None = None  # host KV blocks, replacing host_kv_gib's
    # exact event leaping: decode-only GPU rounds leapt, assists and Prefill-to-CPU copies worked
    # out in closed form when nothing can interfere; False steps every event (the reference)
    leap: bool = True
    # -- mechanisms (each on by default; `simserve explain` switches them off one at a time) -----
    # Dense Assist (§4.2): False routes every CPU batch Full-CPU ((P, F) = (C + 1, C): no
    # assist can happen, so the GPU runs whole forward passes without stage-boundary polls)
    dense_assist: bool = True
    # decoupled scheduling (§4.1): False puts an iteration barrier between the engines, as a
    # GPU-gated design has: a CPU batch starts only with a GPU round (or while the GPU engine
    # is idle), and a GPU round waits for the CPU batch in flight; event leaping is off then
    decoupled: bool = True
    # Prefill-to-CPU (App. A.1 step 5): False admits a prompt only where its KV fits HBM
    prefill_to_cpu: bool = True
    # the profile-guided GPU batched-token limit (§4.3); False uses `hard_token_limit` (vLLM
    # 0.22.1's API-server budget) for every round instead (`gpu_token_limit` is then ignored)
    profiled_token_limit: bool = True

    def validate(self) -> None:
        def pos_int(name, allow_none=True):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")

        for n in ("cpu_batch_limit", "gpu_token_limit", "max_num_seqs", "staging_tokens",
                  "host_admission_limit", "num_gpu_blocks_override", "num_cpu_blocks_override"):
            pos_int(n)
        pos_int("tp")
        for n in ("cpu_tp", "hard_token_limit", "block_size"):
            pos_int(n, allow_none=False)
        for n in ("leap", "dense_assist", "decoupled", "prefill_to_cpu", "profiled_token_limit"):
            if not isinstance(getattr(self, n), bool):
                raise ValueError(f"{n}: expected true or false, got {getattr(self, n)!r}")
        if not (isinstance(self.host_kv_gib, (int, float)) and self.host_kv_gib > 0):
            raise ValueError(f"host_kv_gib: expected a positive number, got {self.host_kv_gib!r}")
        if not (0 < self.gpu_memory_utilization <= 1):
            raise ValueError(f"gpu_memory_utilization: expected a number in (0, 1], got "
                             f"{self.gpu_memory_utilization!r}")
        for n in ("assist_eps", "assist_lambda", "boundary_poll_us"):
            v = getattr(self, n)
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{n}: expected a non-negative number, got {v!r}")
        if self.assist_host_us is not None and self.assist_host_us < 0:
            raise ValueError(f"assist_host_us: expected a non-negative number, got "
                             f"{self.assist_host_us!r}")
        p, f = self.assist_p, self.assist_f
        if (p is None) != (f is None):
            raise ValueError("assist_p: set both assist_p and assist_f, or neither")
        if p is not None:
            if not all(isinstance(x, int) and x >= 0 for x in (p, f)) or not (
                    (p, f) == (0, 0) or f < p):
                raise ValueError(f"assist_p: (P, F) = ({p}, {f}) is not legal: (0, 0) or "
                                 "0 <= F < P (Eq. 5)")
