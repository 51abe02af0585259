"""Data-parallel replicas of one engine class behind a least-loaded router."""
from __future__ import annotations

from simserve.errors import ConfigError
from simserve.sim.context import SimContext


def build_replicas(ctx: SimContext, cfg, engine_cls) -> callable:
    """num_gpus / tp engine replicas; arrivals go to the replica with the fewest requests
    (running + waiting), the lowest index on ties."""
    G, tp = ctx.hardware.num_gpus, cfg.tp
    if G % tp:
        raise ConfigError(f"policy {engine_cls.kind}: tp={tp} does not divide num_gpus={G}")
    engines = [engine_cls(ctx, cfg, i, list(range(i * tp, (i + 1) * tp))) for i in range(G // tp)]
    return start_replicas(ctx, engines, engine_cls.kind)


def start_replicas(ctx: SimContext, engines: list, kind: str) -> callable:
    """Check that one replica's KV pool holds the longest request, start every engine's
    process, and return the arrival handler (least-loaded replica, lowest index on ties)."""
    t = ctx.table
    if t.n:
        need = int((t.prompt + t.output).max())
        cap = engines[0].pool.capacity_tokens
        if need > cap:
            num = int(((t.prompt + t.output) > cap).sum())
            raise ConfigError(
                f"policy {kind}: {num} request(s) need up to {need} tokens of KV but one replica "
                f"holds {cap}; cap the workload's context, raise gpu_memory_utilization or the "
                "TP degree")
    for e in engines:
        ctx.env.process(e.run())
    ctx.stats["engines"] = [dict(e.kv_summary, gpus=e.gpus) for e in engines]
    ctx.stats["_engines"] = engines

    if len(engines) == 1:
        return engines[0].enqueue

    def on_arrival(rid: int) -> None:
        min(engines, key=lambda e: e.load()).enqueue(rid)
    return on_arrival
