"""Sweeps: an experiment YAML plus `sweep:` (dotted keys → lists or ranges of values) and
`variants:` (names → dotted overrides), expanded into points and run, one folder per point.

    name: budgets
    model: llama-3.1-8b
    hardware: {gpu: h100-sxm}
    workload: {trace: synthetic-conversation, num_requests: 2000, seed: 0}
    policies:
      - {name: vllm, max_num_batched_tokens: 2048}
    sweep:
      workload.rates: {range: [4, 32, 4]}            # 4, 8, ..., 32 (stop included on the grid)
      policies.0.max_num_batched_tokens: [512, 2048, 8192]
      slo.tbt_ms: {linspace: [100, 300, 3]}          # also {geomspace: [a, b, n]}
    variants:
      h100: {}
      h200: {hardware.gpu: h200-sxm}

A point is one simulation: one policy × rate × seed × value of every swept key × variant, an
`ExperimentConfig` with a single policy, rate and seed, stored in `OUT/points/<cfg.hash()>/`
(see `sweep_run.py`).
Variants are applied before the swept values, so a variant may replace `policies` and the
sweep still set `policies.0.x`. Every point is parsed and checked before anything runs.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from simserve.errors import ConfigError, SimserveError, did_you_mean
from simserve.runner.config import (TOP_KEYS, ExperimentConfig, WorkloadConfig,
                                        apply_override, parse_experiment, rebase_trace,
                                        rebased_trace)
from simserve.runner.point import make_workload, points
from simserve.runner.yamlio import Located, line_of, load_located
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.metrics import SLO
from simserve.policies import check_hardware, get_policy

SWEEP_KEYS = ("sweep", "variants")
AXIS_FORMS = ("range", "linspace", "geomspace")
_SECTIONS = {"hardware": HardwareConfig, "workload": WorkloadConfig, "slo": SLO}
_ALIASES = {"workload.rate": "workload.rates", "workload.seed": "workload.seeds"}


@dataclass(frozen=True)
class SweepPoint:
    key: str                  # cfg.hash(): the point's folder name
    cfg: ExperimentConfig     # one policy, one rate, one seed
    variant: str | None
    values: tuple             # ((swept key, value), ...) in file order
    index: int                # position in expansion order (the order of the summaries)

    @property
    def policy(self) -> str:
        return self.cfg.policies[0].label

    @property
    def rate(self) -> float:
        return self.cfg.workload.rates[0]

    @property
    def seed(self) -> int:
        return self.cfg.workload.seeds[0]

    def ident(self) -> dict:
        return {"point": self.key, "variant": self.variant, **dict(self.values)}

    def describe(self) -> str:
        parts = ([f"variant={self.variant}"] if self.variant is not None else []) + \
            [f"{k}={v}" for k, v in self.values] + \
            [f"policy={self.policy}", f"rate={self.rate:g}", f"seed={self.seed}"]
        return ", ".join(parts)


@dataclass(frozen=True)
class Sweep:
    name: str
    source: str
    axes: tuple[str, ...]          # swept keys, in file order
    variants: tuple[str, ...]      # empty when the file has none
    points: tuple[SweepPoint, ...]  # one per coordinate; two may share a simulation (hash)
    lines: dict = dataclasses.field(default_factory=dict)  # (variant, key) -> line in source

    def unique(self) -> list[SweepPoint]:
        """The distinct simulations, first occurrence first (a variant that changes one
        policy leaves the others' points identical to the base's: they run once)."""
        seen: dict[str, SweepPoint] = {}
        for sp in self.points:
            seen.setdefault(sp.key, sp)
        return list(seen.values())


# ---------------------------------------------------------------------------- parsing

def load_sweep(path: str | Path, overrides: list[str] = ()) -> Sweep:
    """Read, override (`--set`; `sweep.KEY=[...]` and `variants.NAME.KEY=v` work too), expand."""
    data = load_located(path)
    src = str(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: expected a mapping at the top level")
    _rebase_traces(data, path)
    for item in overrides:
        _apply_set(data, item, src)
    return expand(data, src)


def _rebase_traces(data: dict, path) -> None:
    """Relative trace paths written in the file (base, `sweep:`, `variants:`) name files
    beside it (`config.rebase_trace`); `--set` values stay relative to the working folder."""
    rebase_trace(data, path)
    axis = data.get("sweep", {}).get("workload.trace") if isinstance(data.get("sweep"), dict) \
        else None
    if isinstance(axis, list):
        axis[:] = [rebased_trace(v, path) for v in axis]
    variants = data.get("variants")
    for ov in (variants.values() if isinstance(variants, dict) else ()):
        if isinstance(ov, dict) and "workload.trace" in ov:
            ov["workload.trace"] = rebased_trace(ov["workload.trace"], path)


def _apply_set(data: dict, item: str, src: str) -> None:
    key = item.split("=", 1)[0].strip()
    head, _, rest = key.partition(".")
    if head not in SWEEP_KEYS or not rest or "=" not in item:
        apply_override(data, item, src)
        return
    value = yaml.safe_load(item.split("=", 1)[1])
    node = data.setdefault(head, _located())
    if head == "variants":
        name, _, rest = rest.partition(".")
        if not rest:
            raise ConfigError(f"--set {key}: expected variants.NAME.KEY=VALUE")
        node = node.setdefault(name, _located())
    node[rest] = value
    if isinstance(node, Located):
        node.key_lines = {**getattr(node, "key_lines", {}), rest: 0}  # no line: from --set


def _located(d=None, line: int = 0) -> Located:
    out = Located(d or {})
    out.line, out.key_lines = line, {}
    return out


def _at(src: str, line: int) -> str:
    return f"{src}:{line}" if line else f"{src} (--set)"


def _where(src: str, obj, key=None) -> str:
    ln = line_of(obj, key)
    return f"{src}:{ln}" if ln else src


def expand(data: dict, src: str = "<dict>") -> Sweep:
    """Every point of a sweep document, each parsed by the experiment parser (no I/O)."""
    for k in data:
        if k not in TOP_KEYS + SWEEP_KEYS:
            raise ConfigError(f"{_where(src, data, k)}: {k}: unknown key"
                              f"{did_you_mean(k, TOP_KEYS + SWEEP_KEYS)}; allowed: "
                              f"{', '.join(TOP_KEYS + SWEEP_KEYS)}")
    base = _located({k: v for k, v in data.items() if k not in SWEEP_KEYS},
                    getattr(data, "line", 0))
    base.key_lines = dict(getattr(data, "key_lines", {}))
    axes = _parse_axes(data.get("sweep"), data, src)
    variants = _parse_variants(data.get("variants"), data, src)
    for name, ovs in variants:
        for key, _, line in ovs:
            if any(a[0] == key for a in axes):
                raise ConfigError(f"{_at(src, line)}: variants.{name}.{key}: also swept in "
                                  "`sweep:`; set a key in one place only")
    overridden = {k for k, _, _ in axes} | {k for _, ovs in variants for k, _, _ in ovs}
    for key, _, line in axes:
        _check_path(key, base, src, line, f"sweep.{key}", overridden)
    for name, ovs in variants:
        for key, _, line in ovs:
            _check_path(key, base, src, line, f"variants.{name}.{key}", overridden)

    out: list[SweepPoint] = []
    for vname, ovs in variants:
        for combo in itertools.product(*[vals for _, vals, _ in axes]):
            doc = copy.deepcopy(base)
            for key, value, line in ovs:
                _set(doc, key, value, line)
            values = tuple((key, _plain(v)) for (key, _, _), v in zip(axes, combo))
            for (key, _, line), value in zip(axes, combo):
                _set(doc, key, value, line)
            label = ", ".join(([f"variant={vname}"] if vname is not None else [])
                              + [f"{k}={v}" for k, v in values]) or "the base config"
            try:
                cfg = parse_experiment(doc, src)
            except ConfigError as exc:
                raise ConfigError(f"{exc} (in the sweep point {label})") from None
            for pt in points(cfg):
                wl = dataclasses.replace(cfg.workload, rates=(pt.rate,), seeds=(pt.seed,))
                one = dataclasses.replace(cfg, policies=(pt.policy,), workload=wl, raw={})
                sp = SweepPoint(one.hash(), one, vname, values, len(out))
                out.append(sp)
    name = str(base.get("name") or Path(src).stem)
    lines = {(None, k): ln for k, _, ln in axes}
    lines.update({(v, k): ln for v, ovs in variants for k, _, ln in ovs})
    return Sweep(name, src, tuple(k for k, _, _ in axes),
                 tuple(v for v, _ in variants if v is not None), tuple(out), lines)


def _parse_axes(node, data, src: str) -> list[tuple[str, list, int]]:
    if node is None:
        return []
    if not isinstance(node, dict) or not node:
        raise ConfigError(f"{_where(src, data, 'sweep')}: sweep: expected a mapping of dotted "
                          "keys to lists of values, e.g. {workload.rates: [2, 4, 8]}")
    axes = []
    for key, spec in node.items():
        line = line_of(node, key) or 0
        key = _ALIASES.get(str(key), str(key))
        if any(a[0] == key for a in axes):
            raise ConfigError(f"{_at(src, line)}: sweep.{key}: swept twice")
        axes.append((key, axis_values(spec, f"{_at(src, line)}: sweep.{key}"), line))
    return axes


def _parse_variants(node, data, src: str) -> list[tuple[str | None, list]]:
    if node is None:
        return [(None, [])]
    if not isinstance(node, dict) or not node:
        raise ConfigError(f"{_where(src, data, 'variants')}: variants: expected a mapping of "
                          "names to overrides, e.g. {h200: {hardware.gpu: h200-sxm}}")
    out = []
    for name, ovs in node.items():
        if ovs is None:
            ovs = {}
        if not isinstance(ovs, dict):
            raise ConfigError(f"{_where(src, node, name)}: variants.{name}: expected a mapping "
                              f"of dotted keys to values, got {ovs!r}")
        out.append((str(name), [(_ALIASES.get(str(k), str(k)), v, line_of(ovs, k) or 0)
                                for k, v in ovs.items()]))
    return out


def axis_values(spec, where: str = "sweep") -> list:
    """The values of one swept key: a list, or {range: [start, stop, step]} (stop included
    when it lands on the grid), {linspace: [a, b, n]}, {geomspace: [a, b, n]}."""
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where}: empty list of values")
        for i, v in enumerate(spec):
            if v in spec[:i]:
                raise ConfigError(f"{where}: value {v!r} listed twice")
        return list(spec)
    if isinstance(spec, dict) and len(spec) == 1:
        form, args = next(iter(spec.items()))
        if form not in AXIS_FORMS:
            raise ConfigError(f"{where}: unknown form {form!r}{did_you_mean(form, AXIS_FORMS)}"
                              f"; expected one of {', '.join(AXIS_FORMS)}")
        return _form_values(form, args, where)
    raise ConfigError(f"{where}: expected a list of values or one of {{range: [start, stop, "
                      f"step]}}, {{linspace: [a, b, n]}}, {{geomspace: [a, b, n]}}; got "
                      f"{spec!r} (write [{spec!r}] for a single value)")


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _form_values(form: str, args, where: str) -> list:
    n_args = (2, 3) if form == "range" else (3,)
    if not isinstance(args, list) or len(args) not in n_args or not all(_num(a) for a in args):
        shape = "[start, stop, step]" if form == "range" else "[a, b, n]"
        raise ConfigError(f"{where}: {form}: expected {shape} of numbers, got {args!r}")
    if form == "range":
        start, stop, step = (args + [1])[:3]
        if step == 0 or (stop - start) * step < 0:
            raise ConfigError(f"{where}: range: step {step!r} never gets from {start!r} to "
                              f"{stop!r}")
        n = int(math.floor((stop - start) / step * (1 + 1e-12) + 1e-9)) + 1
        vals = [start + i * step for i in range(n)]
        if all(isinstance(a, int) for a in (start, stop, step)):
            return vals
        return [float(f"{v:.12g}") for v in vals]
    a, b, n = args
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"{where}: {form}: n must be a positive integer, got {n!r}")
    if form == "geomspace" and (a <= 0 or b <= 0):
        raise ConfigError(f"{where}: geomspace: a and b must be positive, got {a!r}, {b!r}")
    if n == 1:
        vals = [float(a)]
    elif form == "linspace":
        vals = [a + (b - a) * i / (n - 1) for i in range(n)]
    else:
        vals = [a * (b / a) ** (i / (n - 1)) for i in range(n)]
    vals = [float(f"{v:.12g}") for v in vals]
    if isinstance(a, int) and isinstance(b, int) and all(v.is_integer() for v in vals):
        return [int(v) for v in vals]
    if len(set(vals)) < len(vals):
        raise ConfigError(f"{where}: {form}: values repeat: {vals}")
    return vals


def _known_keys() -> list[str]:
    keys = list(TOP_KEYS)
    for sec, cls in _SECTIONS.items():
        keys += [f"{sec}.{f.name}" for f in dataclasses.fields(cls)]
    return keys + ["workload.rate", "workload.seed", "policies.0.name", "policies.0.label"]


def _check_path(key: str, base: dict, src: str, line: int, shown: str, overridden) -> None:
    """A swept or variant key must name a config field: fail at its line, with a hint."""
    parts = key.split(".")
    head = parts[0]
    err = f"{_at(src, line)}: {shown}: "
    if head not in TOP_KEYS:
        raise ConfigError(f"{err}unknown key{did_you_mean(key, _known_keys())}; keys start "
                          f"with one of {', '.join(TOP_KEYS)}")
    if head in ("name", "model") and len(parts) > 1:
        raise ConfigError(f"{err}{head} has no sub-keys")
    if head in _SECTIONS and len(parts) > 1:
        fields = [f.name for f in dataclasses.fields(_SECTIONS[head])]
        if len(parts) > 2 or parts[1] not in fields:
            raise ConfigError(f"{err}unknown key{did_you_mean(key, _known_keys())}; "
                              f"{head} keys: {', '.join(fields)}")
    if head == "policies" and len(parts) > 1:
        pols = base.get("policies")
        n = len(pols) if isinstance(pols, list) else 0
        if "policies" in overridden:
            return  # a variant replaces the list: the parser checks each point
        if not parts[1].isdigit() or int(parts[1]) >= n:
            raise ConfigError(f"{err}expected policies.N.KEY with N an index of the "
                              f"{n} base polic{'y' if n == 1 else 'ies'} (0..{n - 1})")
        if len(parts) > 3:
            raise ConfigError(f"{err}too many parts; expected policies.N.KEY")
        pol = pols[int(parts[1])]
        if len(parts) == 3 and isinstance(pol, dict) and f"policies.{parts[1]}.name" not in \
                overridden and parts[2] not in ("name", "label"):
            try:
                fields = [f.name for f in dataclasses.fields(get_policy(str(pol["name"]))[0])]
            except (ConfigError, KeyError):
                return  # the parser reports the bad policy itself
            if parts[2] not in fields:
                raise ConfigError(f"{err}unknown parameter of policy {pol['name']!r}"
                                  f"{did_you_mean(parts[2], fields)}; known: "
                                  f"{', '.join(sorted(fields))}")


def _set(doc: dict, key: str, value, line: int) -> None:
    parts = key.split(".")
    node = doc
    for part in parts[:-1]:
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"line {line}: {key}: no list item {part!r}")
            node = node[int(part)]
            continue
        if node.get(part) is None:
            node[part] = _located(line=line)
            if isinstance(node, Located):
                node.key_lines = {**getattr(node, "key_lines", {}), part: line}
        node = node[part]
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"line {line}: {key}: {part} is not a mapping")
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = copy.deepcopy(value)
        return
    if key in ("workload.rates", "workload.seeds"):
        node.pop(last[:-1], None)  # `rate:` in the base gives way to the swept `rates`
    node[last] = copy.deepcopy(value)
    if isinstance(node, Located):  # errors about this field then name the sweep's line
        node.key_lines = {**getattr(node, "key_lines", {}), last: line}


def _plain(v):
    """YAML-located containers as plain dicts/lists (for JSON records)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def check_points(sweep: Sweep) -> dict:
    """What can fail before running, once per distinct hardware and workload: profile names,
    trace files, the workload build. Returns the resolved hardware by `HardwareConfig`."""
    hardware, wl_seen = {}, set()
    for sp in sweep.points:
        cfg = sp.cfg
        try:
            if cfg.hardware not in hardware:
                hardware[cfg.hardware] = resolve_hardware(cfg.hardware)
            check_hardware(cfg.policies[0].config, cfg.hardware)
            wkey = (cfg.model, dataclasses.replace(cfg.workload, rates=(1.0,), seeds=(0,)))
            if wkey not in wl_seen:
                make_workload(cfg, sp.rate, sp.seed)
                wl_seen.add(wkey)
        except SimserveError as exc:
            field_ = str(exc).split(":", 1)[0]  # e.g. hardware.gpu: name the line that set it
            ln = sweep.lines.get((sp.variant, field_)) or sweep.lines.get((None, field_))
            where = f"{sweep.source}:{ln}" if ln else sweep.source
            raise type(exc)(f"{where}: {exc} (in the sweep point {sp.describe()})") from None
    return hardware
