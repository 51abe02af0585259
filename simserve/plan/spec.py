"""The plan YAML, read strictly: unknown keys are errors naming the file, the line and the
field (as the experiment YAML's are), with a "did you mean".

    name: chat-8b
    model: llama-3.1-8b
    workload: {trace: synthetic-conversation, num_requests: 400, rate: 12}  # or rate: maximise
    slo: {ttft_ms: 2000, tbt_ms: 100, attainment: 0.95, targets: ["p99_itl_ms<=150"]}
    hardware:
      - {gpu: h100-sxm, num_gpus: [1, 2, 4]}
      - {gpu: rtx4090, num_gpus: [1], cpu: xeon-silver-4510, cpu_cores: [12], host_memory_gib: 256}
    designs:
      - {policy: vllm, tp: [1, 2], max_num_batched_tokens: [2048, 8192],
         router: [least_outstanding, prefix_affinity]}
      - {policy: dualpace, cpu_batch_limit: [64, 128]}
    prices: on-demand-2026          # shipped table, a file, or {file: ..., gpu_hour: {h20: 1.8}}
    objective: cheapest             # or goodput_per_dollar
    search: {frontier: 2, seeds: [0, 1], rtol: 0.05}
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from simserve.errors import ConfigError, did_you_mean
from simserve.runner.yamlio import line_of, load_located
from simserve.runner.config import check_keys, check_top, where

TOP_KEYS = ("name", "model", "workload", "slo", "hardware", "designs", "prices", "objective",
            "search")
HW_KEYS = ("gpu", "num_gpus", "cpu", "cpu_cores", "host_memory_gib", "nvlink", "pcie")
SLO_KEYS = ("ttft_ms", "tbt_ms", "tpot_ms", "e2el_ms", "attainment", "targets")
SEARCH_KEYS = ("frontier", "seeds", "rtol", "eta", "screen_requests", "routers_for_winner",
               "max_simulated")
OBJECTIVES = ("cheapest", "goodput_per_dollar")
# policies whose replicas sit behind their `router` option -> the policy simulated (itself)
ROUTED = {"vllm": "vllm", "sarathi": "sarathi"}
ROUTER_KEYS = ("router", "affinity_blocks", "affinity_load_factor")


@dataclass(frozen=True)
class HardwareChoice:
    gpu: str
    num_gpus: tuple[int, ...]
    cpu: str | None = None
    cpu_cores: tuple[int | None, ...] = (None,)
    host_memory_gib: float | None = None
    nvlink: str | None = None
    pcie: str | None = None


@dataclass(frozen=True)
class DesignChoice:
    policy: str
    knobs: tuple[tuple[str, tuple], ...]   # (option, values to search), in YAML order
    line: int | None = None


@dataclass(frozen=True)
class SearchOptions:
    frontier: int = 2              # simulated candidates per (design, GPU), best estimates first
    seeds: tuple[int, ...] = (0, 1)  # the last rung's seeds; the first rung runs the first one
    rtol: float = 0.05             # capacity bisection stops when the bracket is this narrow
    eta: int = 2                   # successive halving keeps 1/eta of the candidates per rung
    screen_requests: int | None = None  # first rung's requests (default a quarter of the plan's)
    routers_for_winner: bool = True     # bisect the winner under every router too
    max_simulated: int | None = None    # stop simulating new candidates after this many


@dataclass(frozen=True)
class PlanSpec:
    name: str
    model: str
    workload: dict                  # the experiment's workload keys, without `rate`
    rate: float | None              # requests/s to serve; None = maximise
    slo: dict                       # the experiment's slo keys
    attainment: float
    targets: tuple[str, ...]        # further percentile targets, e.g. "p99_itl_ms<=150"
    hardware: tuple[HardwareChoice, ...]
    designs: tuple[DesignChoice, ...]
    prices: object = "on-demand-2026"
    objective: str = "cheapest"
    search: SearchOptions = field(default_factory=SearchOptions)
    source: str = "<dict>"

    def key(self) -> str:
        """sha256[:16] of the plan's content, simserve's version and its code and profiles
        (`provenance.code_hash`): a state file written for another plan, another simserve or
        an older profile is never read back."""
        import simserve
        from simserve.runner.provenance import code_hash
        d = dataclasses.asdict(self)
        d.pop("source")
        blob = json.dumps({"plan": d, "version": simserve.__version__, "code": code_hash()},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


_where = where  # the experiment YAML's error locations and key checks (runner.config)
_keys = check_keys


def _ints(v, src, obj, key, path, *, allow_none=False) -> tuple:
    vals = tuple(v) if isinstance(v, list) else (v,)
    for x in vals:
        if x is None and allow_none:
            continue
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ConfigError(f"{_where(src, obj, key, path)}: expected a positive integer "
                              f"or a list of them, got {v!r}")
    return vals


def load_plan(path: str | Path) -> PlanSpec:
    return parse_plan(load_located(path), str(path))


def parse_plan(data: dict, src: str = "<dict>") -> PlanSpec:
    model = check_top(data, TOP_KEYS, ("model", "workload", "slo", "hardware", "designs"), src)
    wl = data["workload"]
    if not isinstance(wl, dict):
        raise ConfigError(f"{_where(src, data, 'workload', 'workload')}: expected a mapping")
    rate = _rate(wl, src)
    slo_obj = data["slo"]
    _keys(slo_obj, SLO_KEYS, src, "slo")
    att = slo_obj.get("attainment", 0.95)
    if isinstance(att, bool) or not isinstance(att, (int, float)) or not 0 < att <= 1:
        raise ConfigError(f"{_where(src, slo_obj, 'attainment', 'slo.attainment')}: expected a "
                          f"fraction in (0, 1], got {att!r}")
    slo = {k: v for k, v in slo_obj.items() if k not in ("attainment", "targets")}
    if "ttft_ms" not in slo or not ({"tbt_ms", "tpot_ms"} & set(slo)):
        raise ConfigError(f"{_where(src, slo_obj, path='slo')}: a plan needs slo.ttft_ms and "
                          "one of slo.tbt_ms / slo.tpot_ms (the analytical screen prices "
                          "first-token and per-token deadlines)")
    targets = _targets(slo_obj, src)
    objective = data.get("objective", "cheapest" if rate is not None else "goodput_per_dollar")
    if objective not in OBJECTIVES:
        raise ConfigError(f"{_where(src, data, 'objective', 'objective')}: expected one of "
                          f"{', '.join(OBJECTIVES)}, got {objective!r}"
                          f"{did_you_mean(str(objective), OBJECTIVES)}")
    if objective == "cheapest" and rate is None:
        raise ConfigError(f"{_where(src, data, 'objective', 'objective')}: cheapest needs a "
                          "workload.rate to serve (or objective: goodput_per_dollar)")
    spec = PlanSpec(str(data.get("name", Path(src).stem)), model,
                    {k: v for k, v in wl.items() if k != "rate"}, rate, slo, float(att), targets,
                    _hardware(data["hardware"], src), _designs(data["designs"], src),
                    data.get("prices", "on-demand-2026"), objective,
                    _search(data.get("search") or {}, src), src)
    _check_experiment(spec, data)
    return spec


def _rate(wl: dict, src: str) -> float | None:
    if "rates" in wl:
        raise ConfigError(f"{_where(src, wl, 'rates', 'workload.rates')}: a plan serves one "
                          "rate: give workload.rate (requests/s) or rate: maximise")
    r = wl.get("rate", "maximise")
    if r in ("maximise", "maximize"):
        return None
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not r > 0:
        raise ConfigError(f"{_where(src, wl, 'rate', 'workload.rate')}: expected a positive "
                          f"request rate or 'maximise', got {r!r}")
    return float(r)


def _targets(slo_obj: dict, src: str) -> tuple[str, ...]:
    """`slo.targets`: percentile bounds that must hold as well as the attainment (capacity
    target expressions: `p99_ttft_ms<=2000`, `p99_itl_ms<=150`, `mean_tpot_ms<=50`)."""
    from simserve.capacity import parse_target
    from simserve.errors import SimserveError
    raw = slo_obj.get("targets") or []
    raw = raw if isinstance(raw, list) else [raw]
    for t in raw:
        try:
            parse_target(str(t))
        except SimserveError as exc:
            raise ConfigError(f"{_where(src, slo_obj, 'targets', 'slo.targets')}: "
                              f"{str(exc).replace('--target ', '')}") from None
    return tuple(str(t) for t in raw)


def _hardware(items, src: str) -> tuple[HardwareChoice, ...]:
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{src}: hardware: expected a non-empty list of GPU kinds")
    from simserve.hardware.profile import load_profile
    out = []
    for i, h in enumerate(items):
        path = f"hardware[{i}]"
        _keys(h, HW_KEYS, src, path)
        if "gpu" not in h:
            raise ConfigError(f"{_where(src, h, path=path)}: each hardware entry needs a 'gpu'")
        for k, kind in (("gpu", "gpu"), ("cpu", "cpu"), ("nvlink", "link"), ("pcie", "link")):
            if h.get(k) is not None:
                try:
                    load_profile(str(h[k]), expect_kind=kind)
                except ConfigError as exc:
                    raise ConfigError(f"{_where(src, h, k, f'{path}.{k}')}: {exc}") from None
        mem = h.get("host_memory_gib")
        if mem is not None and (isinstance(mem, bool) or not isinstance(mem, (int, float))
                                or mem <= 0):
            raise ConfigError(f"{_where(src, h, 'host_memory_gib', path + '.host_memory_gib')}"
                              f": expected a positive number of GiB, got {mem!r}")
        if h.get("cpu_cores") is not None and h.get("cpu") is None:
            raise ConfigError(f"{_where(src, h, 'cpu_cores', path + '.cpu_cores')}: cpu_cores "
                              "without a cpu: name the host CPU profile")
        out.append(HardwareChoice(
            str(h["gpu"]), _ints(h.get("num_gpus", 1), src, h, "num_gpus", path + ".num_gpus"),
            h.get("cpu"), _ints(h.get("cpu_cores"), src, h, "cpu_cores", path + ".cpu_cores",
                                allow_none=True),
            None if mem is None else float(mem), h.get("nvlink"), h.get("pcie")))
    return tuple(out)


def _designs(items, src: str) -> tuple[DesignChoice, ...]:
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{src}: designs: expected a non-empty list")
    from simserve.policies import ALIASES, get_policy, policy_names
    out = []
    for i, d in enumerate(items):
        path = f"designs[{i}]"
        if not isinstance(d, dict) or "policy" not in d:
            raise ConfigError(f"{_where(src, d if isinstance(d, dict) else items, path=path)}: "
                              "each design needs a 'policy'")
        name = str(d["policy"])
        if name not in policy_names() and name not in ALIASES:
            raise ConfigError(f"{_where(src, d, 'policy', path + '.policy')}: unknown policy "
                              f"{name!r}{did_you_mean(name, policy_names())}")
        cls, _ = get_policy(name)
        allowed = ["policy"] + [f.name for f in dataclasses.fields(cls)]
        _keys(d, allowed, src, path)
        knobs = tuple((k, tuple(v) if isinstance(v, list) else (v,))
                      for k, v in d.items() if k != "policy")
        for k, vals in knobs:
            if not vals:
                raise ConfigError(f"{_where(src, d, k, f'{path}.{k}')}: empty list of values")
        out.append(DesignChoice(name, knobs, line_of(d)))
    return tuple(out)


def _search(obj, src: str) -> SearchOptions:
    _keys(obj, SEARCH_KEYS, src, "search")
    kw = dict(obj)
    if "seeds" in kw:
        kw["seeds"] = tuple(kw["seeds"]) if isinstance(kw["seeds"], list) else (kw["seeds"],)
    try:
        opts = SearchOptions(**kw)
    except TypeError as exc:
        raise ConfigError(f"{_where(src, obj, path='search')}: {exc}") from None
    for k in ("frontier", "eta", "screen_requests", "max_simulated"):
        v = getattr(opts, k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{_where(src, obj, k, 'search.' + k)}: expected a positive "
                              f"integer, got {v!r}")
    if not opts.seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0
                             for s in opts.seeds):
        raise ConfigError(f"{_where(src, obj, 'seeds', 'search.seeds')}: expected "
                          f"non-negative integers, got {opts.seeds!r}")
    if not 0 < opts.rtol < 1:
        raise ConfigError(f"{_where(src, obj, 'rtol', 'search.rtol')}: expected a fraction "
                          f"in (0, 1), got {opts.rtol!r}")
    return opts


def _check_experiment(spec: PlanSpec, data: dict) -> None:
    """The workload and SLO as `simserve run` reads them: their errors name the plan's lines."""
    from simserve.runner.config import parse_experiment
    wl = type(data["workload"])(spec.workload) if isinstance(data["workload"], dict) else {}
    if hasattr(data["workload"], "key_lines"):
        wl.key_lines, wl.line = data["workload"].key_lines, data["workload"].line
    slo = type(data["slo"])(spec.slo)
    if hasattr(data["slo"], "key_lines"):
        slo.key_lines, slo.line = data["slo"].key_lines, data["slo"].line
    parse_experiment({"name": spec.name, "model": spec.model, "workload": wl, "slo": slo,
                      "policies": [{"name": "vllm"}]}, spec.source)
