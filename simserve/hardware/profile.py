"""`HardwareProfile`: one device or link read from `NAME.yaml` in the profile folders
(`profile_dirs()`: the user's folders, then the ones shipped in `simserve/data/hwprofiles/`).

Schema (`schema: simserve-hwprofile/1`), shared by GPUs, CPUs and links:

    name, kind (gpu | cpu | link)
    provenance: {type: measured | derived | assumed, ...where the numbers came from...}
    spec:       datasheet numbers with their `sources`
    overheads:  per-iteration and launch costs (GPU/CPU)
    ops:        {MODEL: {tpN: op tables}} fitted latency functions per model and TP degree
    link:       (links) bandwidth per direction, latency, collective parameters

See `docs/hwprofiles.md` for every field.
"""
from __future__ import annotations

from typing import Any

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from simserve.errors import ConfigError, did_you_mean
from simserve.hardware.attention import decode_fn, prefill_fn
from simserve.hardware.functions import Affine, Curve
from simserve.parsed_cache import cached_parse
from simserve.paths import REPO_ROOT, shipped_profile_dir, user_profile_dirs

SCHEMA = "simserve-hwprofile/1"
KINDS = ("gpu", "cpu", "link")
__all__ = ["REPO_ROOT", "HardwareProfile", "available_profiles", "load_profile", "profile_dirs"]


def profile_dirs() -> list[Path]:
    """Where profiles are looked up, earlier first: $SIMSERVE_PROFILE_DIR (os.pathsep-separated),
    ~/.config/simserve/hwprofiles, ~/.cache/simserve/hwprofiles (XDG variables honoured), then
    the profiles shipped with the package (`simserve/data/hwprofiles/`)."""
    return user_profile_dirs() + [shipped_profile_dir()]


def available_profiles() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in reversed(profile_dirs()):  # earlier dirs win
        if d.is_dir():
            for p in sorted(d.glob("*.yaml")):
                found[p.stem] = p
    return found


@dataclass(slots=True)
class ModelOps:
    """Fitted functions of one model at one TP degree on one device (all per layer, µs)."""

    dense: dict[str, Curve]          # qkv, o, gate_up, down, elementwise: f(tokens)
    lm_head: Curve                    # f(rows that sample)
    prefill_attn: Any                 # .us(chunks, contexts) -> µs (attention.py)
    decode_attn: Any                  # .us(batch, Σ context) -> µs, vectorised over Σ context
    varlen_decode: Affine | None = None  # extra µs per decode context token in a mixed call
    source: str = "measured"


@dataclass(slots=True)
class CpuOps:
    """Fitted functions of one model on `cores` CPU cores (per layer, µs)."""

    cores: int
    dense: dict[str, Curve]   # qkv, o, gate_up, down: f(tokens = decode batch)
    lm_head: Curve
    decode_attn: Any          # .us(batch, Σ context)
    source: str


@dataclass(slots=True)
class HardwareProfile:
    name: str
    kind: str
    path: Path
    provenance: dict
    spec: dict
    overheads: dict = field(default_factory=dict)
    link: dict = field(default_factory=dict)
    raw_ops: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)  # links: measured copy / collective tables
    _ops_cache: dict = field(default_factory=dict, repr=False)

    @property
    def provenance_type(self) -> str:
        return self.provenance.get("type", "?")

    def models(self) -> list[str]:
        return sorted(self.raw_ops)

    def ops(self, model: str, tp: int) -> ModelOps:
        key = (model, tp)
        if key not in self._ops_cache:
            self._ops_cache[key] = self._build_ops(model, tp)
        return self._ops_cache[key]

    def cpu_core_counts(self, model: str) -> list[int]:
        return sorted(int(k[5:]) for k in self.raw_ops.get(model, {}) if k.startswith("cores"))

    def cpu_ops(self, model: str, cores: int) -> CpuOps:
        """CPU tables at exactly `cores` cores (profiles hold the counts they were built for)."""
        key = ("cpu", model, cores)
        if key in self._ops_cache:
            return self._ops_cache[key]
        have = self.cpu_core_counts(model)
        if cores not in have:
            raise ConfigError(f"{self.path}: ops.{model}: no CPU tables for {cores} cores; "
                              f"this profile has {have or 'none'} for {model}")
        t = self.raw_ops[model][f"cores{cores}"]
        base = f"{self.name}/{model}/cores{cores}"
        try:
            dense = {op: Curve.from_lists(f"{base}/{op}", t["tokens"], t[f"{op}_us"])
                     for op in ("qkv", "o", "gate_up", "down")}
            lm = Curve.from_lists(f"{base}/lm_head", t["tokens"], t["lm_head_us"])
            dec = decode_fn(f"{base}/decode_attn", t["decode_attn"])
        except KeyError as exc:
            raise ConfigError(f"{self.path}: ops.{model}.cores{cores}: missing field "
                              f"{exc.args[0]!r}") from None
        out = CpuOps(cores, dense, lm, dec, str(t.get("source", self.provenance_type)))
        self._ops_cache[key] = out
        return out

    def _build_ops(self, model: str, tp: int) -> ModelOps:
        where = f"{self.path}: ops"
        if model not in self.raw_ops:
            raise ConfigError(
                f"{where}: no op tables for model {model!r}{did_you_mean(model, self.raw_ops)}; "
                f"this profile covers: {', '.join(self.models()) or 'none'}"
            )
        per_tp = self.raw_ops[model]
        tkey = f"tp{tp}"
        if tkey not in per_tp:
            raise ConfigError(f"{where}.{model}: no tables for TP degree {tp}; has {sorted(per_tp)}")
        t = per_tp[tkey]
        where = f"{where}.{model}.{tkey}"
        try:
            tokens = t["tokens"]
            dense = {op: Curve.from_lists(f"{self.name}/{model}/{tkey}/{op}", tokens, t[f"{op}_us"])
                     for op in ("qkv", "o", "gate_up", "down", "elementwise")}
            lm = Curve.from_lists(f"{self.name}/{model}/{tkey}/lm_head", tokens, t["lm_head_us"])
            base = f"{self.name}/{model}/{tkey}"
            pre = prefill_fn(f"{base}/prefill_attn", t["prefill_attn"])
            dec = decode_fn(f"{base}/decode_attn", t["decode_attn"])
            vl = t.get("varlen_decode")
            vl = Affine.from_mapping(f"{base}/varlen_decode", vl) if vl else None
            return ModelOps(dense, lm, pre, dec, vl, str(t.get("source", self.provenance_type)))
        except KeyError as exc:
            raise ConfigError(f"{where}: missing field {exc.args[0]!r}") from None
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def link_curve(p: HardwareProfile, key: str) -> Curve | None:
    """A measured time-vs-bytes table of a link profile (e.g. `allreduce_ranks2`), if present."""
    t = p.tables.get(key)
    return Curve.from_lists(f"{p.name}/{key}", t["bytes"], t["us"]) if t else None


def load_profile(name_or_path: str | Path, expect_kind: str | None = None) -> HardwareProfile:
    p = Path(name_or_path)
    if not (p.suffix in (".yaml", ".yml") and p.exists()):
        known = available_profiles()
        if str(name_or_path) not in known:
            names = sorted(n for n, q in known.items()
                           if expect_kind is None or _peek_kind(q) == expect_kind)
            what = f"{expect_kind} profile" if expect_kind else "hardware profile"
            raise ConfigError(
                f"unknown {what} {str(name_or_path)!r}{did_you_mean(name_or_path, names)}; "
                f"known: {', '.join(names)} (searched {', '.join(map(str, profile_dirs()))})"
            )
        p = known[str(name_or_path)]
    return _parse(p, expect_kind)


def _peek_kind(p: Path) -> str | None:
    try:
        with open(p) as f:
            for line in f:
                if line.startswith("kind:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster
_PARSED: dict = {}  # (path, mtime_ns, size) -> parsed YAML; profiles are read-only once loaded


def _read_yaml(p: Path):
    st = p.stat()
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _PARSED:
        _PARSED[key] = cached_parse(p, "hwprofile", _parse_yaml)
    return _PARSED[key]


def _parse_yaml(p: Path):
    with open(p) as f:
        return yaml.load(f, Loader=_LOADER)


def _parse(p: Path, expect_kind: str | None) -> HardwareProfile:
    try:
        d = _read_yaml(p)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    if d.get("schema") != SCHEMA:
        raise ConfigError(f"{p}: schema: expected {SCHEMA!r}, got {d.get('schema')!r}")
    allowed = {"schema", "name", "kind", "provenance", "spec", "overheads", "link", "ops",
               "copy_tables", "comparison"}
    for k in d:
        if k not in allowed:
            raise ConfigError(f"{p}: unknown key {k!r}{did_you_mean(k, allowed)}")
    for k in ("name", "kind", "provenance", "spec"):
        if k not in d:
            raise ConfigError(f"{p}: missing required key {k!r}")
    kind = d["kind"]
    if kind not in KINDS:
        raise ConfigError(f"{p}: kind: expected one of {KINDS}, got {kind!r}")
    if expect_kind and kind != expect_kind:
        raise ConfigError(f"{p}: profile {d['name']!r} is a {kind}, expected a {expect_kind}")
    prov = d["provenance"]
    if not isinstance(prov, dict) or prov.get("type") not in ("measured", "derived", "assumed"):
        raise ConfigError(f"{p}: provenance.type: expected 'measured', 'derived' or 'assumed'")
    return HardwareProfile(name=d["name"], kind=kind, path=p, provenance=prov, spec=d["spec"],
                           overheads=d.get("overheads") or {}, link=d.get("link") or {},
                           raw_ops=d.get("ops") or {}, tables=d.get("copy_tables") or {})
