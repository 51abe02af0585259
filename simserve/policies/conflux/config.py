"""Parameters of the `conflux` policy (ConfluxServe §5–6, §8.1), with defaults and where they
came from."""
from __future__ import annotations

from dataclasses import dataclass

from simserve.policies.conflux.dispatch import DEFAULT_QUANTUM
from simserve.policies.conflux.fit import DECODE_MODES
from simserve.policies.conflux.placement import DEFAULT_ETA, DEFAULT_HEADROOM, PLACEMENTS

SCHEDULERS = ("slo", "fcfs")
# Dispatch headroom: prefill is dispatched so that the *estimated* iteration stays within
# τ·(1 − tbt_margin). Not in the paper (its dispatch uses τ itself): it covers what the paper's
# affine estimator cannot express on this cost model, chiefly prefill attention, whose profiled
# kernel costs more per unit of causal work ℓ(c + (ℓ+1)/2) on the diagonal than over the cached
# context (the affine f_P under-predicts a 6,309-token chunk at no context by 25 %), and FCFS
# dispatch keeps forming exactly such chunks (a new prompt's first). Default None: calibrated
# per configuration (`fit.calibrate_margin`), like the estimator itself from profiles: over
# 1,000 random decode states (Table 4's ranges) filled by Alg. 1 at this τ, the margin that
# brings the 99th percentile of the cost-model iteration back within τ (0.5 % steps). On H100:
# Qwen3-14B 6 / 7.5 / 7 % at τ = 50 / 100 / 150 ms, Llama-3.1-8B 9 % at 50 ms, Qwen3-32B
# (TP2 × SP4) 7.5 % at 100 ms (`python benchmarks/conflux_estimator.py`). 0: the paper's rule.
DEFAULT_TBT_MARGIN = None
# The estimator ConfluxServe dispatches with:
# - "paper" (default): the paper's, built as §6.2 / App. D build it: affine f_D in Σ context
#   (Eq. 8), Eq. 2 to the letter (a lone path is multiplied by its factor too), α, β fitted
#   for the lowest MAPE on mixed batches of the "hardware" (the cost model), no dispatch margin;
# - "oracle" (the default until 2026-12-01): f_D read from the ground-truth decode-attention
#   profile (longest context included), α, β copied from the cost model, contention only where
#   both paths run, and a dispatch margin calibrated so that the simulator's own p99 iteration
#   stays within τ: knowledge the real system does not have.
# decode_estimate, estimator_literal and tbt_margin override the preset's choice one by one.
ESTIMATORS = ("paper", "oracle")


@dataclass(frozen=True, slots=True)
class ConfluxConfig:
    """`scheduler: slo` is full ConfluxServe (Moore–Hodgson admission, EDF then SJF backfill);
    `fcfs` is ConfluxServe-FCFS (the paper's execution-only comparison). The GPUs are split into
    `instances` XP instances; each has `num_gpus / instances / tp` logical ranks of TP `tp`."""

    # XP instances the GPUs are split into; the global router sends each arrival to the one
    # with the least queued prefill work per logical rank (§5)
    instances: int = 1
    tp: int = 1                      # base TP per logical rank (§8.1: 1 for 8B/14B, 2 for 32B)
    # "slo": ConfluxServe (Alg. 1: Moore–Hodgson admission, EDF then SJF backfill);
    # "fcfs": ConfluxServe-FCFS, the paper's execution-only comparison (§8)
    scheduler: str = "slo"
    # TTFT SLO that admission plans against (Moore–Hodgson, Alg. 4); §8.1: 2 s / 100 ms for
    # Qwen3-14B/32B (1 s / 50 ms for 8B)
    ttft_ms: float = 2000.0
    tbt_ms: float = 100.0            # τ: the TBT budget every iteration is dispatched against
    # α: slowdown of the decode-attention path when it overlaps prefill attention in the split
    # attention region (Eq. 2: T = max(β·T_P, α·T_D)); None: the GPU profile's
    # `overheads.sp_contention` (h200-sxm: α 1.0, β 1.72 measured on real SP2 runs, validation/;
    # derived GPUs rescaled from it by bandwidth per SM, hardware/rescale.py); "paper": the
    # paper's Fig. 14a value 1.28 (simserve/cost/sp.py), a what-if; a number overrides
    alpha: float | str | None = None
    # β: slowdown of the prefill-attention path in the same region; None / "paper" as for alpha
    beta: float | str | None = None
    # the split attention region overlaps prefill and decode attention (max of the two paths);
    # False runs them one after the other (their sum): Fig. 13's first ablation
    overlap: bool = True
    # latency estimator dispatch uses: "paper" (Eq. 2–6 fitted as §6.2 / App. D: affine f_D,
    # Eq. 2 to the letter, α, β fitted, no margin) or "oracle" (f_D from the profile, the cost
    # model's α, β, a calibrated margin: knowledge the real system lacks); see ESTIMATORS
    estimator: str = "paper"
    # dispatch against τ·(1 − margin), a fraction; None: the estimator's (paper 0; oracle
    # calibrated per configuration so the simulator's p99 iteration stays within τ)
    tbt_margin: float | None = DEFAULT_TBT_MARGIN
    # f_D of the estimator: "profile" evaluates the decode-attention profile of each rank's
    # decode set (longest context included: split-K stragglers); "affine" is Eq. 8 (a_D·Σc + a_D0)
    decode_estimate: str | None = None   # None: the preset's (paper "affine", oracle "profile")
    # True: the estimator's Eq. 2 to the letter (a lone prefill or decode path is multiplied by
    # its contention factor too); False: α, β price the two paths running together only, as
    # the SP cost model does (estimator.py)
    estimator_literal: bool | None = None  # None: the preset's (paper True, oracle False)
    # η: dual-mode decode placement (Alg. 3): while a feasible rank's KV use is below η, a
    # finished prefill's decode goes worst-fit (spread), else best-fit (pack); the paper gives
    # no value (placement.py)
    eta: float = DEFAULT_ETA
    # h: share of a rank's KV pool kept free when a finished prefill's KV is placed there
    # (room for its decodes to grow; not given by the paper, placement.py); 0.05
    headroom: float = DEFAULT_HEADROOM
    quantum: int = DEFAULT_QUANTUM   # water-level alignment q, tokens per rank (dispatch.py)
    block_size: int = 16             # tokens per KV block
    # share of HBM for weights, activations and KV: vLLM 0.15.1's default (the paper's base)
    gpu_memory_utilization: float = 0.90
    max_tokens_per_rank: int = 8192  # activation reserve basis and the highest water level tried
    num_gpu_blocks_override: int | None = None  # KV blocks per logical rank
    # iterations of at most the GPU profile's `graph_max_tokens` tokens are priced as a
    # CUDA-graph replay, longer ones as eager launches; False: all eager
    cuda_graphs: bool = True
    leap: bool = True                # exact event leaping over decode-only stretches
    # -- mechanisms (each on by default; `simserve explain` switches them off one at a time) -----
    # Conflux Parallelism's sequence-parallel prefill (§5): False runs each instance as one
    # logical rank of TP num_gpus/instances (no SP; the scheduler unchanged), `tp` is ignored
    sequence_parallel: bool = True
    # waterfill dispatch (Alg. 2): False splits each chunk evenly over the ranks (Fig. 15a)
    waterfill: bool = True
    # decode placement (Alg. 3): "dual-mode" (worst-fit below η, best-fit above); "first-fit"
    # (the lowest-index rank with room: blind to decode load, the what-if of Fig. 15b)
    placement: str = "dual-mode"

    def validate(self) -> None:
        for name in ("instances", "tp", "quantum", "block_size", "max_tokens_per_rank"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        v = self.num_gpu_blocks_override
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"num_gpu_blocks_override: expected a positive integer, got {v!r}")
        for name in ("overlap", "sequence_parallel", "waterfill"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement: expected one of {', '.join(PLACEMENTS)}, "
                             f"got {self.placement!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler: expected one of {', '.join(SCHEDULERS)}, "
                             f"got {self.scheduler!r}")
        for name in ("ttft_ms", "tbt_ms"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"{name}: expected a positive number, got {v!r}")
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if v is None or v == "paper":
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 1:
                raise ValueError(f"{name}: expected a contention factor >= 1, \"paper\" or null "
                                 f"(the GPU profile's), got {v!r}")
        m = self.tbt_margin
        if m is not None and (not isinstance(m, (int, float)) or isinstance(m, bool)
                              or not 0 <= m < 1):
            raise ValueError(f"tbt_margin: expected a fraction in [0, 1) or null (calibrated), "
                             f"got {m!r}")
        if self.estimator_literal is not None and not isinstance(self.estimator_literal, bool):
            raise ValueError(f"estimator_literal: expected true or false (or null: the "
                             f"estimator's), got {self.estimator_literal!r}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator: expected one of {', '.join(ESTIMATORS)}, "
                             f"got {self.estimator!r}")
        if self.decode_estimate is not None and self.decode_estimate not in DECODE_MODES:
            raise ValueError(f"decode_estimate: expected one of {', '.join(DECODE_MODES)}, "
                             f"got {self.decode_estimate!r}")
        if not 0 <= self.eta <= 1:
            raise ValueError(f"eta: expected a fraction in [0, 1], got {self.eta!r}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom: expected a fraction in [0, 1), got {self.headroom!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization: expected a number in (0, 1], got {u!r}")
