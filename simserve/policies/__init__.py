"""Serving policies, registered by name. The contract a policy meets is `policies/base.py`:
a config dataclass (its YAML parameters) and `build(ctx, cfg) -> Deployment`, registered
together with `@register(name, ConfigClass)` on the build function.

Where names come from:
- built-ins: `BUILTINS`, one explicit table of name -> the module whose `@register` names it;
  the module is imported when the policy is first used, so naming or checking a policy
  imports no policy. A test checks the table against what importing every module registers;
- other packages: the entry-point group `simserve.policies` in their own pyproject
  (`[project.entry-points."simserve.policies"] toy = "toy_policy"`): loading the entry point
  imports the module, whose `@register("toy", ...)` registers it (docs/how-to/add-a-policy.md);
- `register` itself, called at run time (a notebook or test defines a policy in place).
`ALIASES` are deprecated names still accepted for an existing policy (with a warning).
"""
from __future__ import annotations

import dataclasses
import importlib
import warnings
from typing import Callable

from simserve.errors import ConfigError, did_you_mean

ENTRY_POINT_GROUP = "simserve.policies"
_REGISTRY: dict[str, tuple[type, Callable]] = {}
# built-in policy name -> the module that registers it (`@register(name, ...)`)
BUILTINS: dict[str, str] = {
    "chunked": "simserve.policies.chunked_prefill_tp",
    "conflux": "simserve.policies.conflux.policy",
    "distserve": "simserve.policies.distserve.policy",
    "dualpace": "simserve.policies.dualpace.engine",
    "loongserve": "simserve.policies.loongserve.engine",
    "muxwise": "simserve.policies.muxwise.engine",
    "neo": "simserve.policies.neo",
    "sarathi": "simserve.policies.sarathi",
    "vllm": "simserve.policies.vllm",
}
# deprecated name -> the policy it now is: the routed variants became the `router` option
ALIASES: dict[str, str] = {"sarathi-routed": "sarathi", "vllm-routed": "vllm"}
# (name, the warnings filter list it was shown under): a dependency adding a filter (pandas on
# import) resets a registry's once-per-location memory, so the list itself is remembered
_ALIAS_WARNED: list[tuple[str, object]] = []


def register(name: str, config_cls: type):
    """Decorator for a policy's `build(ctx, cfg) -> Deployment`: registers it under `name`
    with its config dataclass. A second, different registration of one name is an error."""
    def deco(build_fn: Callable) -> Callable:
        old = _REGISTRY.get(name)
        if old is not None and old[1] is not build_fn and \
                (old[1].__module__, old[1].__qualname__) != (build_fn.__module__,
                                                             build_fn.__qualname__):
            raise ConfigError(f"policy {name!r} is registered twice: by {old[1].__module__} "
                              f"and by {build_fn.__module__}")
        _REGISTRY[name] = (config_cls, build_fn)
        return build_fn
    return deco


def check_hardware(policy_config, hardware) -> None:
    """What a policy needs of the experiment's hardware (a `HardwareConfig`, or the resolved
    `Hardware` a build gets), checked before anything runs and again at build: the
    `hardware.*` fields its config class names in `NEEDS_HARDWARE` (e.g. a CPU-tier design's
    `("cpu", "cpu_cores")`)."""
    for f in getattr(type(policy_config), "NEEDS_HARDWARE", ()):
        if getattr(hardware, f, None) is None:
            who = next((n for n, (cls, _) in _REGISTRY.items() if cls is type(policy_config)),
                       type(policy_config).__name__)
            raise ConfigError(f"hardware.{f}: policy {who} runs on the host CPU too; set "
                              f"hardware.{f} (e.g. hardware: {{cpu: xeon-silver-4510, "
                              f"cpu_cores: 12}})")


def builtin_policies() -> dict[str, str]:
    """Built-in policy name -> the module whose `@register` names it (`BUILTINS`)."""
    return dict(BUILTINS)


def _entry_points() -> dict:
    from importlib.metadata import entry_points
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def policy_names() -> list[str]:
    """Every policy that can be named: built-ins, entry points and run-time registrations."""
    return sorted({*builtin_policies(), *_entry_points(), *_REGISTRY})


def get_policy(name: str) -> tuple[type, Callable]:
    """(config class, build) of policy `name`, importing its module on first use; a deprecated
    name (`ALIASES`) gives its policy's, with a FutureWarning."""
    if name in ALIASES and name not in _REGISTRY:
        # one line per process, or per `warnings.catch_warnings()` block
        if not any(n == name and f is warnings.filters for n, f in _ALIAS_WARNED):
            _ALIAS_WARNED.append((name, warnings.filters))
            warnings.warn_explicit(f"policy {name!r} is deprecated: use policy "
                                   f"{ALIASES[name]!r}, whose `router` option picks the "
                                   f"router (default least_outstanding)", FutureWarning,
                                   "simserve", 0)
        name = ALIASES[name]
    if name in _REGISTRY:
        return _REGISTRY[name]
    builtin = builtin_policies().get(name)
    if builtin is not None:
        importlib.import_module(builtin)
        where = builtin
    else:
        eps = _entry_points()
        if name not in eps:
            known = policy_names()
            raise ConfigError(f"unknown policy {name!r}{did_you_mean(name, known)}; "
                              f"known: {', '.join(known)}")
        try:
            eps[name].load()
        except Exception as exc:  # a broken third-party package: say which entry point
            raise ConfigError(f"policy {name!r}: entry point {eps[name].value!r} of group "
                              f"{ENTRY_POINT_GROUP} failed to load: {exc}") from None
        where = f"entry point {eps[name].value!r}"
    if name not in _REGISTRY:
        raise ConfigError(f"policy {name!r}: {where} was imported but registered no policy "
                          f"{name!r} (@register({name!r}, ConfigClass) on its build function)")
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
