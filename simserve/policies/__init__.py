"""Serving policies, registered by name. Each module defines a config dataclass (its YAML
parameters, with defaults and where they came from) and a `build(ctx, cfg)` that starts its
engine processes on the simulation context and returns an arrival handler."""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from simserve.errors import ConfigError, did_you_mean

# name -> module that registers it (imported lazily so one policy never imports another)
_MODULES = {"vllm": "simserve.policies.vllm", "sarathi": "simserve.policies.sarathi",
            "neo": "simserve.policies.neo",
            "dualpace": "simserve.policies.dualpace.engine",
            "conflux": "simserve.policies.conflux.policy",
            "loongserve": "simserve.policies.loongserve.engine",
            "chunked": "simserve.policies.chunked_prefill_tp",
            "distserve": "simserve.policies.distserve",
            "muxwise": "simserve.policies.muxwise"}
_REGISTRY: dict[str, tuple[type, Callable]] = {}


def register(name: str, config_cls: type):
    def deco(build_fn: Callable) -> Callable:
        _REGISTRY[name] = (config_cls, build_fn)
        return build_fn
    return deco


def policy_names() -> list[str]:
    return sorted(_MODULES)


def get_policy(name: str) -> tuple[type, Callable]:
    if name not in _MODULES:
        raise ConfigError(f"unknown policy {name!r}{did_you_mean(name, _MODULES)}; "
                          f"known: {', '.join(policy_names())}")
    if name not in _REGISTRY:
        importlib.import_module(_MODULES[name])
    return _REGISTRY[name]


def make_config(name: str, params: dict, where: str = "policy"):
    """Build the policy's frozen config from YAML parameters, rejecting unknown keys."""
    cls, _ = get_policy(name)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k in params:
        if k not in fields:
            raise ConfigError(f"{where}.{k}: unknown parameter of policy {name!r}"
                              f"{did_you_mean(k, fields)}; known: {', '.join(sorted(fields))}")
    for k, v in params.items():  # a YAML "yes"/"maybe"/1 must not pass for a switch
        if fields[k].type in (bool, "bool") and not isinstance(v, bool):
            raise ConfigError(f"{where}.{k}: expected true or false, got {v!r}")
    try:
        cfg = cls(**params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    check = getattr(cfg, "validate", None)
    if check:
        try:
            check()
        except ValueError as exc:
            raise ConfigError(f"{where}.{exc}") from None
    return cfg
