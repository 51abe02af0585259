"""Experiment YAML → frozen dataclasses, strictly: unknown keys are errors with a "did you
mean", and every error names the file, the line and the field.

    name: quickstart
    model: llama-3.1-8b
    hardware: {gpu: h100-sxm, num_gpus: 1}
    workload: {trace: synthetic-conversation, num_requests: 2000, arrival: poisson,
               rates: [1, 2, 3, 4, 5], seed: 0}
    policies:
      - {name: vllm, max_num_batched_tokens: 2048}
    slo: {ttft_ms: 5000, tbt_ms: 1500}
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from simserve.errors import ConfigError, did_you_mean
from simserve.runner.yamlio import Located, line_of, load_located
from simserve.hardware.setup import HardwareConfig
from simserve.metrics import SLO
from simserve.models import get_model
from simserve.policies import get_policy, make_config

ARRIVALS = ("poisson", "gamma", "scale", "trace")


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    trace: str = "synthetic-conversation"
    num_requests: int | None = 2000
    arrival: str = "poisson"
    rates: tuple[float, ...] = (1.0,)
    seeds: tuple[int, ...] = (0,)
    burstiness_cv: float = 1.0
    start: int = 0
    max_context: int | None = None  # default: the model's max context
    # a request with prompt + output > max_context: "drop" it (as vLLM's server rejects it;
    # counted in num_dropped) or "cap" it to fit (counted in num_capped)
    overlong: str = "drop"
    # `vllm bench serve` names: the random dataset's lengths (trace: random; vLLM's defaults
    # 1024 / 128 / 0.0 when not given), and the client's limit on requests in flight
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: float | None = None
    max_concurrency: int | None = None
    tile: int = 1  # repeat a trace file this many times in time (scale tests)
    # a selected request (after start, num_requests, tile) with 0 output tokens: "error"
    # (refused, naming its line) or "one" (counted as one token, in num_zero_output)
    zero_output: str = "error"

    def random_params(self) -> dict:
        """The random dataset's lengths with vLLM's defaults filled in."""
        return {"random_input_len": 1024 if self.random_input_len is None else self.random_input_len,
                "random_output_len": 128 if self.random_output_len is None else self.random_output_len,
                "random_range_ratio": 0.0 if self.random_range_ratio is None
                else self.random_range_ratio}

    def validate(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival: expected one of {', '.join(ARRIVALS)}, got "
                             f"{self.arrival!r}{did_you_mean(self.arrival, ARRIVALS)}")
        if not self.rates:
            raise ValueError("rates: give at least one request rate")
        for r in self.rates:
            if not isinstance(r, (int, float)) or isinstance(r, bool) or not r > 0:
                raise ValueError(f"rates: request rates must be positive numbers, got {r!r}")
        for s in self.seeds:
            if not isinstance(s, int) or isinstance(s, bool) or s < 0:
                raise ValueError(f"seed: expected a non-negative integer, got {s!r}")
        if self.num_requests is not None and (not isinstance(self.num_requests, int)
                                              or self.num_requests < 1):
            raise ValueError(f"num_requests: expected a positive integer, got {self.num_requests!r}")
        if not self.burstiness_cv > 0:
            raise ValueError(f"burstiness_cv: expected a positive number, got {self.burstiness_cv!r}")
        if not isinstance(self.start, int) or self.start < 0:
            raise ValueError(f"start: expected a non-negative integer, got {self.start!r}")
        from simserve.workload.transform import OVERLONG, ZERO_OUTPUT
        if self.zero_output not in ZERO_OUTPUT:
            raise ValueError(f"zero_output: expected one of {', '.join(ZERO_OUTPUT)}, got "
                             f"{self.zero_output!r}"
                             f"{did_you_mean(str(self.zero_output), ZERO_OUTPUT)}")
        if self.overlong not in OVERLONG:
            raise ValueError(f"overlong: expected one of {', '.join(OVERLONG)}, got "
                             f"{self.overlong!r}{did_you_mean(str(self.overlong), OVERLONG)}")
        for k in ("random_input_len", "random_output_len", "random_range_ratio"):
            if getattr(self, k) is not None and self.trace != "random":
                raise ValueError(f"{k}: only for trace: random (this workload's trace is "
                                 f"{self.trace!r})")
        for k in ("random_input_len", "random_output_len", "max_concurrency", "tile"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{k}: expected a positive integer, got {v!r}")
        r = self.random_range_ratio
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float))
                              or not 0 <= r < 1):
            raise ValueError(f"random_range_ratio: expected a number in [0, 1), got {r!r}")


@dataclass(frozen=True)
class PolicySpec:
    name: str
    label: str
    config: object  # the policy's own frozen config dataclass


@dataclass(frozen=True)
class ExperimentConfig:
    name: str
    model: str
    hardware: HardwareConfig
    workload: WorkloadConfig
    policies: tuple[PolicySpec, ...]
    slo: SLO | None = None
    source: str = "<dict>"
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    def resolved(self) -> dict:
        """Plain-data form with every default filled in (what gets hashed and saved)."""
        return {
            "name": self.name, "model": self.model,
            "hardware": dataclasses.asdict(self.hardware),
            "workload": _resolved_workload(self.workload),
            "policies": [{"name": p.name, "label": p.label, **dataclasses.asdict(p.config)}
                         for p in self.policies],
            "slo": dataclasses.asdict(self.slo) if self.slo else None,
        }

    def hash(self) -> str:
        """sha256[:16] of the resolved config and of the hardware profile files it uses (a
        refitted profile makes new points; cached results are keyed by this)."""
        from simserve.hardware.setup import profiles_digest
        blob = json.dumps({"config": self.resolved(), "profiles": profiles_digest(self.hardware)},
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


TOP_KEYS = ("name", "model", "hardware", "workload", "policies", "slo")
# workload keys added after results were first stored: left out of the resolved config (and so
# of the point hash) while at their defaults, so stored sweep points stay valid
_LATER_WORKLOAD_DEFAULTS = {"random_input_len": None, "random_output_len": None,
                            "random_range_ratio": None, "max_concurrency": None, "tile": 1,
                            "zero_output": "error"}


def _resolved_workload(w: WorkloadConfig) -> dict:
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(w).items()}
    if w.trace == "random":
        out.update(w.random_params())
    for k, default in _LATER_WORKLOAD_DEFAULTS.items():
        if out[k] == default:
            del out[k]
    return out


def _inf(v):
    """`inf` (also `Infinity`, `.inf`) as a rate: YAML reads the bare word as a string."""
    if isinstance(v, str) and v.strip().lower() in ("inf", "+inf", ".inf", "infinity"):
        return float("inf")
    return v


def experiment_path(path: str | Path) -> Path:
    """`path` itself, or for a bare name that is not a file (`quickstart`) the experiment of
    that name shipped with the package (`simserve/data/experiments/NAME.yaml`)."""
    p = Path(path)
    if p.exists() or p.suffix or "/" in str(path) or p.parent != Path("."):
        if not p.exists():
            from simserve.paths import shipped_experiments
            hint = ", ".join(shipped_experiments())
            raise ConfigError(f"{p}: no such file" + (f" (experiments shipped with simserve, "
                                                        f"run by name: {hint})" if hint else ""))
        return p
    from simserve.paths import shipped_experiments
    shipped = shipped_experiments()
    if str(path) in shipped:
        return shipped[str(path)]
    raise ConfigError(f"{path}: no such file, and no shipped experiment of that name"
                      f"{did_you_mean(str(path), shipped)}; shipped: {', '.join(shipped) or 'none'}")


def load_experiment(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:
    path = experiment_path(path)
    data = load_located(path)
    if isinstance(data, dict):
        rebase_trace(data, path)
    for ov in overrides:
        apply_override(data, ov, str(path))
    return parse_experiment(data, str(path))


def rebase_trace(data: dict, path: str | Path) -> None:
    """A relative trace file path written in a YAML file names a file beside that YAML, not in
    the working directory: make it absolute. Manifest and synthetic names (no suffix, no
    slash) stay names; a bare file name is rebased only when the file is there (else the trace
    folders are searched for it, as before). `--set` values are not rebased."""
    wl = data.get("workload")
    if isinstance(wl, dict) and "trace" in wl:
        wl["trace"] = rebased_trace(wl["trace"], path)


def rebased_trace(trace, path: str | Path):
    """One trace value of the YAML file `path`, rebased as `rebase_trace` says."""
    if not isinstance(trace, str) or not trace.strip():
        return trace
    t = Path(trace).expanduser()
    if t.is_absolute() or not (t.suffix or "/" in trace):
        return trace
    cand = Path(path).resolve().parent / t
    return str(cand) if "/" in trace or cand.is_file() else trace


def apply_override(data: dict, item: str, src: str) -> None:
    """`--set a.b.c=value` (value parsed as YAML; list items by index, e.g. policies.0.x)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. workload.rates=[1,2]")
    key, val = item.split("=", 1)
    try:
        value = yaml.safe_load(val)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: cannot parse value {val!r}: {exc}") from None
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {key}: empty part in the dotted key")
    node = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {key}: {'.'.join(parts[:i])} has no item {part!r}")
            node = node[int(part)]
        elif isinstance(node, dict):
            if part not in node:
                node[part] = Located()
            node = node[part]
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"--set {key}: {'.'.join(parts[:i + 1])} is "
                              f"{type(node).__name__} {node!r}, not a mapping; it has no "
                              f"key {parts[i + 1]!r}")
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"--set {key}: no list item {last!r}")
        node[int(last)] = value
    else:
        node[last] = value


def where(src: str, obj, key=None, path: str = "") -> str:
    ln = line_of(obj, key)
    return f"{src}:{ln}: {path}" if ln else f"{src}: {path}"


def check_keys(obj, allowed, src: str, path: str) -> None:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where(src, obj, path=path)}: expected a mapping, got {obj!r}")
    for k in obj:
        if k not in allowed:
            raise ConfigError(f"{where(src, obj, k, f'{path}.{k}' if path else str(k))}: unknown "
                              f"key{did_you_mean(k, allowed)}; allowed: {', '.join(allowed)}")


def _dataclass_from(cls, obj, src: str, path: str, rename: dict | None = None):
    names = [f.name for f in dataclasses.fields(cls)]
    allowed = names + list(rename or {})
    check_keys(obj, allowed, src, path)
    kw = {}
    for k, v in obj.items():
        kw[(rename or {}).get(k, k)] = v
    try:
        cfg = cls(**kw)
        if hasattr(cfg, "validate"):
            cfg.validate()
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        field_ = msg.split(":", 1)[0] if ":" in msg else None
        raise ConfigError(f"{where(src, obj, field_, path)}: {msg}") from None
    return cfg


def check_top(data: dict, allowed, required, src: str) -> str:
    """A YAML file's top level (an experiment's or a plan's): no unknown key, every required
    one present; returns the catalog name of its `model`."""
    check_keys(data, allowed, src, "")
    for k in required:
        if k not in data:
            raise ConfigError(f"{src}: missing required key {k!r}")
    try:
        return get_model(str(data["model"])).name
    except ValueError as exc:
        raise ConfigError(f"{where(src, data, 'model', 'model')}: {exc}") from None


def parse_experiment(data: dict, src: str = "<dict>") -> ExperimentConfig:
    model = check_top(data, TOP_KEYS, ("model", "workload", "policies"), src)
    hw = _dataclass_from(HardwareConfig, data.get("hardware") or {}, src, "hardware")
    w = dict(data["workload"]) if isinstance(data["workload"], dict) else data["workload"]
    wl_obj = data["workload"]
    if isinstance(w, dict):
        for one, many in (("rate", "rates"), ("seed", "seeds")):
            if one in w and many in w:
                raise ConfigError(f"{where(src, wl_obj, one, 'workload.' + one)}: give {one} or "
                                  f"{many}, not both")
            if one in w:
                w[many] = w.pop(one)
            if many in w:
                v = w[many]
                w[many] = tuple(v) if isinstance(v, (list, tuple)) else (v,)
        if "rates" in w:
            w["rates"] = tuple(_inf(v) for v in w["rates"])
    if not isinstance(w, dict):
        raise ConfigError(f"{where(src, data, 'workload', 'workload')}: expected a mapping, "
                          f"got {w!r}")
    wl = _dataclass_from(WorkloadConfig, _relocate(w, wl_obj), src, "workload",
                         rename=None)
    pols = data["policies"]
    if not isinstance(pols, list) or not pols:
        raise ConfigError(f"{where(src, data, 'policies', 'policies')}: expected a non-empty list")
    specs, labels = [], set()
    for i, p in enumerate(pols):
        path = f"policies[{i}]"
        if not isinstance(p, dict) or "name" not in p:
            raise ConfigError(f"{where(src, p if isinstance(p, dict) else pols, path=path)}: "
                              "each policy needs a 'name'")
        params = {k: v for k, v in p.items() if k not in ("name", "label")}
        try:
            get_policy(p["name"])
            cfg = make_config(p["name"], params, path)
        except ConfigError as exc:
            bad = str(exc).split(":", 1)[0].split(".")[-1]
            raise ConfigError(f"{where(src, p, bad if bad in p else 'name', '')}{exc}") from None
        label = str(p.get("label", p["name"]))
        if label in labels:
            raise ConfigError(f"{where(src, p, 'name', path)}: two policies share the label "
                              f"{label!r}; give each a distinct 'label'")
        labels.add(label)
        specs.append(PolicySpec(p["name"], label, cfg))
    slo = None
    if data.get("slo") is not None:
        slo = _dataclass_from(SLO, data["slo"], src, "slo")
    name = _check_name(data, src)
    return ExperimentConfig(name=name, model=model, hardware=hw,
                            workload=wl, policies=tuple(specs), slo=slo, source=src, raw=data)


def _check_name(data: dict, src: str) -> str:
    """The experiment's name: it names the default results folder (`results/NAME`), so it
    must be one plain folder name, never a path that leads elsewhere."""
    name = data.get("name")
    if name is None or name == "":
        return Path(src).stem
    if not isinstance(name, (str, int, float)) or isinstance(name, bool):
        raise ConfigError(f"{where(src, data, 'name', 'name')}: expected a text, got {name!r}")
    name = str(name)
    bad = ("is an absolute path" if name.startswith(("/", "\\")) or Path(name).is_absolute()
           else "contains a path separator" if "/" in name or "\\" in name
           else "is not a folder name" if name.strip() in (".", "..") or "\0" in name
           else None)
    if bad:
        raise ConfigError(f"{where(src, data, 'name', 'name')}: {name!r} {bad}; the name "
                          "becomes the results folder results/NAME, so use a plain name such "
                          "as my-run (choose the folder itself with --out)")
    return name


def _relocate(new: dict, old) -> Located:
    out = Located(new)
    out.line = getattr(old, "line", 0)
    lines = dict(getattr(old, "key_lines", {}))
    for one, many in (("rate", "rates"), ("seed", "seeds")):
        if one in lines:
            lines[many] = lines[one]
    out.key_lines = lines
    return out
