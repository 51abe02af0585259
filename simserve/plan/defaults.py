"""What a candidate runs with where the plan names no value, read from its policy's own config:
the config dataclass the policy registered (its defaults) and, for the vLLM family, the
release defaults `ChunkedConfig.resolve` picks for the GPU. The screen and the feasibility
check then price the settings the simulation will use, and a default changed in a policy's
config moves them too."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from simserve.errors import ConfigError
from simserve.hardware.profile import load_profile


@dataclass(frozen=True)
class Settings:
    """One engine kind's settings as its policy resolves them."""

    utilization: float     # gpu_memory_utilization
    block_size: int        # tokens per KV block
    budget: int            # token budget of an iteration (sizes the activation reserve)
    max_seqs: int          # sequences per iteration (sizes the activation reserve)


# the policy option holding each design's token budget and row limit (None: the builder's own)
_BUDGET = {"distserve": "prefill_max_tokens", "conflux": "max_tokens_per_rank",
           "neo": "max_tokens_in_batch", "dualpace": "hard_token_limit",
           "muxwise": "prefill_max_tokens"}
_SEQS = {"distserve": "max_num_seqs", "neo": "max_batch_size", "muxwise": "max_num_seqs"}
# conflux's and loongserve's builders size the activation reserve for 1,024 rows, and
# loongserve's for 8,192 tokens (`conflux/policy.py`, `loongserve/engine.py`): no option holds it
_BUILDER_SEQS = 1024
_BUILDER_TOKENS = 8192


@functools.lru_cache(maxsize=1024)
def policy_config(policy: str, options: tuple):
    """The policy's config for these (name, value) options, every default filled in."""
    from simserve.policies import make_config
    try:
        return make_config(policy, dict(options), where=f"designs: {policy}")
    except ConfigError:
        return None   # options the policy refuses: the simulation reports them


def _resolved(cfg, gpu: str) -> dict | None:
    """`ChunkedConfig.resolve` (the vLLM family) for `gpu`, else None."""
    resolve = getattr(cfg, "resolve", None)
    if resolve is None:
        return None
    return resolve(float(load_profile(gpu).spec["memory_gib"]), gpu)


def settings(c, gpu: str | None = None) -> Settings:
    """The settings of candidate `c`'s engines on `gpu` (default: its own GPU kind); for a
    disaggregated design the prefill engine's (`decode_settings` for the decode engine)."""
    gpu = gpu or c.gpu
    cfg = policy_config(c.policy, c.options)
    if cfg is None:
        raise ConfigError(f"designs: {c.design}: options {dict(c.options)} are not the "
                          f"policy's ({c.policy})")
    r = _resolved(cfg, gpu)
    if r is not None:
        return Settings(float(r["gpu_memory_utilization"]), int(cfg.block_size),
                        int(r["max_num_batched_tokens"]), int(r["max_num_seqs"]))
    budget = getattr(cfg, _BUDGET.get(c.design, ""), None)
    if c.design == "dualpace":
        budget = cfg.gpu_token_limit or cfg.hard_token_limit
    seqs = getattr(cfg, _SEQS.get(c.design, ""), None)
    if seqs is None and c.design == "dualpace":
        seqs = _vllm_rows(gpu)
    return Settings(float(cfg.gpu_memory_utilization), int(cfg.block_size),
                    int(budget or _BUILDER_TOKENS), int(seqs or _BUILDER_SEQS))


def decode_settings(c, gpu: str | None = None) -> Settings:
    """distserve's decode engine: its row limit is its token budget (one token a row)."""
    s = settings(c, gpu)
    return Settings(s.utilization, s.block_size, s.max_seqs, s.max_seqs)


def host_kv_gib(c) -> float:
    """The host KV pool a CPU-tier design allocates (its `host_kv_gib`)."""
    cfg = policy_config(c.policy, c.options)
    return float(getattr(cfg, "host_kv_gib", 0.0) or 0.0)


def _vllm_rows(gpu: str) -> int:
    """vLLM's default row limit for `gpu` (`ChunkedConfig.resolve`), as dualpace takes it."""
    from simserve.policies.vllm_engine_config import ChunkedConfig
    return int(ChunkedConfig().resolve(float(load_profile(gpu).spec["memory_gib"]),
                                       gpu)["max_num_seqs"])
