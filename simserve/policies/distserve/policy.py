"""Building `distserve`: prefill instances on the first half of the GPUs, decode instances on
the second (or on a decode pool of its own: `pools.py`), a least-loaded router in front
(simdistserve's rule) and the KV hand-off between."""
from __future__ import annotations

from simserve.errors import ConfigError
from simserve.policies import register
from simserve.policies.base import Deployment, deploy
from simserve.policies.distserve.config import DistServeConfig
from simserve.policies.distserve.decode import DecodeInstance, Handoff
from simserve.policies.distserve.pools import NicLinks, split
from simserve.policies.distserve.prefill import PrefillInstance


@register("distserve", DistServeConfig)
def build(ctx, cfg: DistServeConfig) -> Deployment:
    pl = split(ctx, cfg)
    tp_p, tp_d, dg, pg = pl.tp_p, pl.tp_d, pl.decode_gpus, pl.prefill_gpus
    decoders = [DecodeInstance(pl.decode_ctx, cfg, i, dg[i * tp_d:(i + 1) * tp_d])
                for i in range(len(dg) // tp_d)]
    links = NicLinks(ctx.env, pl.link) if pl.link is not None else None
    handoff = Handoff(ctx, decoders, links)
    prefills = [PrefillInstance(ctx, cfg, 100 + i, pg[i * tp_p:(i + 1) * tp_p], handoff.submit)
                for i in range(len(pg) // tp_p)]
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
                  also_run=[handoff.run()],
                  stats=None if links is None else {"distserve_handoff": links.stats})
