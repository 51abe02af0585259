"""Building `distserve`: prefill instances on the first half of the GPUs, decode instances on
the second, a least-loaded router in front (simdistserve's rule) and the KV hand-off between."""
from __future__ import annotations

from simserve.errors import ConfigError
from simserve.policies import register
from simserve.policies.base import Deployment, deploy
from simserve.policies.distserve.config import DistServeConfig
from simserve.policies.distserve.decode import DecodeInstance, Handoff
from simserve.policies.distserve.prefill import PrefillInstance


def _split(G: int, cfg: DistServeConfig) -> tuple[int, int]:
    if G < 2 or G % 2:
        raise ConfigError(f"policy distserve: a 1:1 prefill/decode split needs an even number of "
                          f"GPUs, got hardware.num_gpus={G}")
    half = G // 2
    tp_p, tp_d = cfg.prefill_tp or half, cfg.decode_tp or half
    for name, tp in (("prefill_tp", tp_p), ("decode_tp", tp_d)):
        if half % tp:
            raise ConfigError(f"policy.{name}: {tp} does not divide the {half} GPUs of its pool")
    return tp_p, tp_d


@register("distserve", DistServeConfig)
def build(ctx, cfg: DistServeConfig) -> Deployment:
    G = ctx.hardware.num_gpus
    tp_p, tp_d = _split(G, cfg)
    half = G // 2
    decoders = [DecodeInstance(ctx, cfg, i, list(range(half + i * tp_d, half + (i + 1) * tp_d)))
                for i in range(half // tp_d)]
    handoff = Handoff(ctx, decoders)
    prefills = [PrefillInstance(ctx, cfg, 100 + i, list(range(i * tp_p, (i + 1) * tp_p)),
                                handoff.submit) for i in range(half // tp_p)]
    t = ctx.table

    def fits() -> None:
        if not t.n:
            return
        for what, need, pool in (("prompt", int(t.prompt.max()), prefills[0].pool),
                                 ("prompt + output", int((t.prompt + t.output).max()),
                                  decoders[0].pool)):
            if pool.blocks_for(need) > pool.num_blocks:
                raise ConfigError(f"policy distserve: a request needs {need} tokens of KV "
                                  f"({what}) but {pool.name} holds {pool.capacity_tokens}; cap "
                                  "the workload's context or raise the TP degree")
    return deploy(ctx, "distserve", [*prefills, *decoders], routes_to=prefills, fits=fits,
                  engine_stats=[dict(e.kv_summary, gpus=e.gpus, role=role)
                                for role, es in (("prefill", prefills), ("decode", decoders))
                                for e in es],
                  also_run=[handoff.run()])
