"""Data-parallel replicas of one engine class behind the least-loaded router."""
from __future__ import annotations

from simserve.errors import ConfigError
from simserve.policies.base import Deployment, deploy
from simserve.sim.context import SimContext


def build_replicas(ctx: SimContext, cfg, engine_cls) -> Deployment:
    """num_gpus / tp replicas of `engine_cls(ctx, cfg, index, gpus)`; arrivals go to the
    replica with the fewest requests (running + waiting), the lowest index on ties."""
    G, tp = ctx.hardware.num_gpus, cfg.tp
    if G % tp:
        raise ConfigError(f"policy {engine_cls.kind}: tp={tp} does not divide num_gpus={G}")
    if getattr(cfg, "offline", False):  # LLM.generate on a list: every request added at once
        ctx.table.scheduled[:] = 0.0
        ctx.table.arrival[:] = 0.0
    engines = [engine_cls(ctx, cfg, i, list(range(i * tp, (i + 1) * tp))) for i in range(G // tp)]
    return deploy(ctx, engine_cls.kind, engines)
