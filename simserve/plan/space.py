"""The candidate space of a plan: every (GPU kind, GPU count, host CPU, design, knob values)
combination, and the feasibility check that prunes what cannot run before anything is
estimated or simulated (weights + activations + the longest request's KV per GPU, heads
divisible by TP·SP, GPU-GPU links, CPU-tier core counts and host memory)."""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from simserve.errors import ConfigError
from simserve.hardware.profile import load_profile
from simserve.kv_budget import gpu_kv_budget
from simserve.models import get_model
from simserve.plan.defaults import Settings, decode_settings, host_kv_gib, settings
from simserve.plan.spec import ROUTED, ROUTER_KEYS, PlanSpec

CPU_TIER = ("dualpace", "neo")   # designs that decode on the host CPU too
POOL_KEYS = ("decode_gpu", "decode_num_gpus")   # a decode pool's knobs: the label's hardware


@dataclass(frozen=True)
class Candidate:
    """One deployment: hardware, a registered policy and its options."""

    model: str
    gpu: str
    num_gpus: int
    cpu: str | None
    cpu_cores: int | None
    nvlink: str | None
    pcie: str | None
    design: str            # the plan's policy name (vllm, dualpace, ...)
    policy: str            # the registered policy simulated (a router is one of its options)
    options: tuple         # (name, value) pairs, in the plan's order

    @property
    def opts(self) -> dict:
        return dict(self.options)

    @property
    def replicas(self) -> int:
        if self.design in ("vllm", "sarathi"):
            return self.num_gpus // int(self.opts.get("tp", 1))
        return 1

    @property
    def decode_pool(self) -> tuple[str, int] | None:
        """(GPU kind, GPU count) of a disaggregated design's own decode pool (`decode_gpu`),
        or None when the design splits `num_gpus` of one kind."""
        o = self.opts
        if self.design != "distserve" or not o.get("decode_gpu"):
            return None
        return str(o["decode_gpu"]), int(o.get("decode_num_gpus") or self.num_gpus)

    @property
    def total_gpus(self) -> int:
        pool = self.decode_pool
        return self.num_gpus + (pool[1] if pool else 0)

    @property
    def label(self) -> str:
        hw = f"{self.num_gpus}x{self.gpu}"
        if self.decode_pool:
            hw += "+{1}x{0}".format(*self.decode_pool)
        if self.design in CPU_TIER and self.cpu:
            hw += f"+{self.cpu}" + (f":{self.cpu_cores}c" if self.cpu_cores else "")
        knobs = ",".join(f"{k}={v}" for k, v in self.options if k not in POOL_KEYS)
        return f"{self.design}[{knobs}]@{hw}" if knobs else f"{self.design}@{hw}"

    @property
    def base(self) -> tuple:
        """The candidate without its router: router variants share it."""
        return (self.gpu, self.num_gpus, self.cpu, self.cpu_cores, self.design,
                tuple((k, v) for k, v in self.options if k not in ROUTER_KEYS))

    def hardware(self) -> dict:
        hw = {"gpu": self.gpu, "num_gpus": self.num_gpus}
        for k in ("nvlink", "pcie"):
            if getattr(self, k):
                hw[k] = getattr(self, k)
        if self.design in CPU_TIER and self.cpu:
            hw["cpu"] = self.cpu
            if self.cpu_cores:
                hw["cpu_cores"] = self.cpu_cores
        return hw

    def host_cores(self) -> int:
        """Cores a CPU tier adds (the profile's count where the plan names none)."""
        if self.design not in CPU_TIER or not self.cpu:
            return 0
        return int(self.cpu_cores or load_profile(self.cpu).spec.get("cores", 0))

    def host_gib(self) -> float:
        if self.design not in CPU_TIER:
            return 0.0
        return host_kv_gib(self)

    def hourly(self, prices) -> float:
        """USD per hour: every GPU of both pools, plus a CPU tier's cores and host memory."""
        usd = prices.hourly(self.gpu, self.num_gpus, self.host_cores(), self.host_gib())
        pool = self.decode_pool
        return usd + prices.hourly(*pool) if pool else usd


def expand(spec: PlanSpec) -> list[Candidate]:
    """Every combination the plan names (feasible or not), deduplicated: a router knob on a
    single replica collapses to one candidate."""
    out, seen = [], set()
    for hw in spec.hardware:
        for n, cores, d in itertools.product(hw.num_gpus, hw.cpu_cores, spec.designs):
            if d.policy not in CPU_TIER and cores != hw.cpu_cores[0]:
                continue  # host cores do not change a GPU-only design
            names = [k for k, _ in d.knobs]
            routed = d.policy in ROUTED and any(k in ROUTER_KEYS for k in names)
            for vals in itertools.product(*(v for _, v in d.knobs)):
                opts = list(zip(names, vals))
                if routed and n // int(dict(opts).get("tp", 1)) <= 1:
                    opts = [(k, v) for k, v in opts if k not in ROUTER_KEYS]
                if d.policy == "neo" and n > 1 and "tp" not in names:
                    opts.append(("tp", n))   # one NEO engine spans the GPUs
                c = Candidate(spec.model, hw.gpu, n, hw.cpu, cores, hw.nvlink, hw.pcie,
                              d.policy, ROUTED[d.policy] if routed else d.policy, tuple(opts))
                if c not in seen:
                    seen.add(c)
                    out.append(c)
    return out


@functools.lru_cache(maxsize=256)
def _gpu_memory(gpu: str) -> float:
    return float(load_profile(gpu).spec["memory_gib"]) * 2**30


def _kv_tokens(model, gpu: str, tp: int, s: Settings) -> int:
    """KV tokens per rank of an engine at TP `tp` on `gpu` with its policy's settings `s`."""
    kv = gpu_kv_budget(model, _gpu_memory(gpu), tp, s.utilization, s.block_size, s.budget,
                       s.max_seqs)
    return kv.num_blocks * s.block_size


def infeasible(c: Candidate, max_request_tokens: int, host_memory_gib: float | None) -> str | None:
    """Why `c` cannot run (a short reason), or None."""
    model = get_model(c.model)
    o = c.opts
    prof = load_profile(c.gpu)
    if c.num_gpus > 1 and not (c.nvlink or prof.spec.get("nvlink")):
        return f"{c.num_gpus} GPUs without a GPU-GPU link"
    groups = _tp_groups(c, model)
    if isinstance(groups, str):
        return groups
    for tp, s, *on in groups:
        gpu = on[0] if on else c.gpu
        try:
            model.check_tp(tp)
        except ValueError:
            return f"TP{tp} does not divide {model.num_heads} heads / {model.num_kv_heads} KV heads"
        if _kv_tokens(model, gpu, tp, s) < max_request_tokens:
            return (f"KV at TP{tp} on {gpu} holds less than the longest request "
                    f"({max_request_tokens} tokens)")
    if c.design in CPU_TIER:
        if not c.cpu:
            return "a CPU-tier design without a host CPU"
        cores, cpu_tp = c.host_cores(), int(o.get("cpu_tp", 1))
        have = load_profile(c.cpu).cpu_core_counts(c.model)
        if cores % cpu_tp or cores // cpu_tp not in have:
            return f"{c.cpu} has no tables at {cores // max(cpu_tp, 1)} cores per rank"
        if host_memory_gib is not None and c.host_gib() > host_memory_gib:
            return f"host KV {c.host_gib():g} GiB > host memory {host_memory_gib:g} GiB"
    return None


def _tp_groups(c: Candidate, model) -> list[tuple] | str:
    """(TP degree, `Settings`[, GPU kind when not the candidate's]) of each kind of engine
    the candidate runs, or why not."""
    o, G = c.opts, c.num_gpus
    if c.decode_pool:
        return _hetero_groups(c)
    if c.design in ("vllm", "sarathi"):
        tp = int(o.get("tp", 1))
        if G % tp:
            return f"TP{tp} does not divide {G} GPUs"
        return [(tp, settings(c))]
    if c.design == "distserve":
        if G < 2 or G % 2:
            return "distserve needs an even number of GPUs (prefill half, decode half)"
        half = G // 2
        ptp, dtp = int(o.get("prefill_tp") or half), int(o.get("decode_tp") or half)
        if half % ptp or half % dtp:
            return f"prefill TP{ptp} / decode TP{dtp} do not divide {half} GPUs"
        return [(ptp, settings(c)), (dtp, decode_settings(c))]
    if c.design == "conflux":
        inst, tp = int(o.get("instances", 1)), int(o.get("tp", 1))
        if G % (inst * tp):
            return f"{inst} instances x TP{tp} do not divide {G} GPUs"
        sp = G // (inst * tp)
        if model.num_heads % (tp * sp):
            return f"TP{tp} x SP{sp} does not divide {model.num_heads} heads"
        return [(tp, settings(c))]
    if c.design in CPU_TIER:
        tp = int(o.get("tp") or G)
        if tp != G:
            return f"{c.design} runs one GPU engine over all {G} GPUs (tp={tp})"
        return [(tp, settings(c))]
    return [(1, settings(c))]


def _hetero_groups(c: Candidate) -> list[tuple] | str:
    """distserve with its own decode pool: prefill over num_gpus, decode over the pool."""
    o, G = c.opts, c.num_gpus
    assert c.decode_pool is not None
    dgpu, D = c.decode_pool
    ptp, dtp = int(o.get("prefill_tp") or G), int(o.get("decode_tp") or D)
    if G % ptp or D % dtp:
        return f"prefill TP{ptp} / decode TP{dtp} do not divide {G} / {D} GPUs"
    try:
        prof = load_profile(dgpu, expect_kind="gpu")
    except ConfigError as exc:
        raise ConfigError(f"designs: distserve decode_gpu: {exc}") from None
    if dtp > 1 and not prof.spec.get("nvlink"):
        return f"decode TP{dtp} on {dgpu} without a GPU-GPU link"
    return [(ptp, settings(c)), (dtp, decode_settings(c, dgpu), dgpu)]
