"""Policy `conflux`: ConfluxServe (§5–6) on `instances` XP instances behind the global router.

The router (§5, step ①) sends each arrival to the instance with the lowest normalised queued
work: remaining prefill tokens queued there per logical rank (every instance has the same
hardware, so per-rank work is work relative to processing capacity); ties go to the lower index.
"""
from __future__ import annotations

import dataclasses

from simserve.cost.sp import PAPER_CONTENTION, SpCostModel, profile_contention
from simserve.policies import register
from simserve.policies.base import Deployment, deploy, executed, fitted_model, kv_blocks
from simserve.policies.conflux.config import ConfluxConfig
from simserve.policies.conflux.engine import XpInstance
from simserve.policies.conflux.placement import PLACEMENTS
from simserve.policies.conflux.fit import calibrate_margin, fit_from_cost, fit_paper
from simserve.policies.conflux.tracking import EstimatorTracker
from simserve.policies.sp_ranks import check_fits, instance_layout
from simserve.sim.context import SimContext


def contention(cfg: ConfluxConfig, gpu) -> tuple[float, float]:
    """The hardware's α, β: as configured (a number; "paper": Fig. 14a's 1.28, a what-if),
    else the GPU profile's `overheads.sp_contention` (measured on the H200, rescaled for
    derived GPUs), else, for a profile without one (datasheet rooflines), the paper's value
    as a named stand-in (simserve.cost.sp.PAPER_CONTENTION)."""
    prof = profile_contention(gpu)
    a, b = (PAPER_CONTENTION if v == "paper" else prof[i] if v is None else float(v)
            for i, v in enumerate((cfg.alpha, cfg.beta)))
    return a, b


@register("conflux", ConfluxConfig)
def build(ctx: SimContext, cfg: ConfluxConfig) -> Deployment:
    hw, model = ctx.hardware, ctx.model
    if not cfg.sequence_parallel:    # one logical rank per instance: TP over its GPUs
        cfg = dataclasses.replace(cfg, tp=max(1, hw.num_gpus // cfg.instances))
    R = instance_layout(hw.num_gpus, cfg.instances, cfg.tp, "conflux")
    alpha, beta = contention(cfg, hw.gpu)
    make = lambda: SpCostModel(model, hw.gpu, hw.nvlink, R, cfg.tp, alpha, beta,  # noqa: E731
                                 cfg.cuda_graphs, table_tokens=cfg.max_tokens_per_rank,
                                 overlap=cfg.overlap)
    # the estimator is fitted on the model (the scheduler's prediction, fixed before serving);
    # the instances execute on `run_cost`, the same model through ctx.gpu_cost_hook
    cost = fitted_model(make, "policy conflux")
    run_cost = executed(ctx, cost)
    paper = cfg.estimator == "paper"          # config.py: the paper's estimator or the oracle
    decode = cfg.decode_estimate or ("affine" if paper else "profile")
    literal = paper if cfg.estimator_literal is None else cfg.estimator_literal
    if paper:
        est = fit_paper(cost, cfg.max_tokens_per_rank, cfg.quantum, decode, literal, cfg.overlap)
    else:
        est = fit_from_cost(cost, alpha, beta, cfg.max_tokens_per_rank, cfg.quantum, decode)
        est = dataclasses.replace(est, overlap=cfg.overlap, literal=literal)
    blocks, kv = kv_blocks(ctx, "policy conflux: tp", cfg.tp, cfg.gpu_memory_utilization,
                           cfg.block_size, cfg.max_tokens_per_rank, 1024,
                           cfg.num_gpu_blocks_override, "use a larger base TP degree",
                           cuda_graphs=cfg.cuda_graphs)
    # dispatch headroom: configured, else none (paper) or calibrated for this estimator at
    # this τ (oracle; config.py)
    margin = cfg.tbt_margin if cfg.tbt_margin is not None else \
        0.0 if paper else calibrate_margin(cost, est, cfg.tbt_ms * 1e-3)
    per = hw.num_gpus // cfg.instances
    xs = [XpInstance(ctx, cfg, i, list(range(i * per, (i + 1) * per)), run_cost, est, blocks)
          for i in range(cfg.instances)]
    counters = {"num_kv_transfers": 0, "num_decode_preemptions": 0,
                "ranks_per_instance": R, "tbt_margin": margin}
    tracker = EstimatorTracker(cfg.tbt_ms * 1e-3)  # shared: instance 0 reports it
    place = PLACEMENTS[cfg.placement]
    for x in xs:
        x.margin = margin
        x.placement = place
        x.counts = counters
        x.tracker = tracker
    estimator = {k: getattr(est, k) for k in
                 ("gamma", "gamma0", "a_d", "a_d0", "a_comm", "a_comm0", "a_p", "a_p0",
                  "alpha", "beta", "literal")}
    estimator.update(kind=cfg.estimator, decode=decode)
    return deploy(
        ctx, "conflux", xs, route_key=lambda x: x.queued_work(),
        fits=lambda: check_fits(ctx, blocks, cfg.block_size, "conflux", kv.kv_bytes / 2**30,
                                cfg.headroom),
        engine_stats=[dict(kv.summary(), num_gpu_blocks=blocks, instance=x.index, rank=r,
                           gpus=x.rank_gpus[r]) for x in xs for r in range(R)],
        stats={"conflux": counters, "estimator": estimator})
