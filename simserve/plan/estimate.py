"""The analytical pre-screen: a steady-state estimate of each candidate's highest rate at the
SLO, from the same fitted cost models the simulator prices iterations with (`GpuCostModel`,
`CpuCostModel`), in the spirit of AIConfigurator's closed-form operating point.

At request rate λ on one engine with token budget M, with mean prompt P and output O, one
iteration of t seconds carries B = λ·O·t decodes (Little's law: each request decodes for O
iterations) and λ·P·t prefill tokens; t is the cost model's time of that batch, solved as a
fixed point (it diverges, or the batch outgrows M, past the engine's capacity). The rate is
feasible when the batch's KV fits, t (the ITL) is within the TBT/TPOT targets and the TTFT
estimate (ceil(P / (M − B)) + 1 iterations, inflated by 1/(1 − ρ) with ρ the budget's
utilisation: an assumed M/D/1-like queueing factor, not a fit) is within the TTFT target.
The capacity is the highest feasible λ (geometric bisection). Per design:

- vllm, sarathi: per replica, times num_gpus / tp replicas (routers are not distinguished);
- conflux: per rank of TP `tp`, times the ranks, with a prompt's chunks spread over its
  instance's SP ranks for the TTFT (an approximation of Ulysses prefill);
- distserve: the lesser of the prefill pool's rate (whole prompts, ρ ≤ 1, TTFT with the same
  queueing factor) and the decode pool's (the fixed point without prefill);
- dualpace, neo: the GPU engine prefills everything and decodes what the CPU tier cannot take;
  the CPU tier takes λ_c = b / (O · t_cpu(b)) for the largest batch b whose iteration meets the
  TBT target and whose KV fits the host pool. Neither design's controls are modelled.

Every row's error against the simulated capacity is reported, so how far to trust this screen
is measured per plan rather than assumed.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from simserve.cost.gpu import BatchShape, GpuCostModel
from simserve.hardware.profile import load_profile
from simserve.models import get_model
from simserve.plan.defaults import Settings, decode_settings, policy_config, settings
from simserve.plan.space import Candidate, _kv_tokens

RATE_LO, RATE_HI = 1e-3, 1e4   # req/s bracket of the screen's bisection
RATE_RTOL = 0.01


@dataclass(frozen=True)
class WorkloadStats:
    mean_prompt: float
    mean_output: float
    max_tokens: int
    num_requests: int


def workload_stats(spec) -> WorkloadStats:
    """Prompt and output lengths of the plan's workload (built once, at rate 1, seed 0)."""
    from simserve.runner.config import parse_experiment
    from simserve.runner.point import make_workload
    cfg = parse_experiment({"name": spec.name, "model": spec.model,
                            "workload": {**spec.workload, "rates": [1.0]},
                            "policies": [{"name": "vllm"}]}, spec.source)
    wl = make_workload(cfg, 1.0, 0)
    p, o = np.asarray(wl.prompt_tokens), np.asarray(wl.output_tokens)
    return WorkloadStats(float(p.mean()), float(o.mean()), int((p + o).max()), len(p))


@dataclass(frozen=True)
class Estimate:
    rate: float        # req/s at the SLO (0: not even the lowest rate)
    itl_s: float       # the iteration time at that rate
    ttft_s: float
    bound: str         # what limits it: budget, kv, itl, ttft, prefill, cpu


@functools.lru_cache(maxsize=512)
def gpu_model(model: str, gpu: str, tp: int, nvlink: str | None) -> GpuCostModel:
    prof = load_profile(gpu)
    nv = nvlink or prof.spec.get("nvlink")
    return GpuCostModel(get_model(model), prof, tp, load_profile(nv) if nv and tp > 1 else None)


def steady(gm: GpuCostModel, lam_prefill: float, lam_decode: float, P: float, O: float,
           budget: int, kv_tokens: int, sp: int = 1, max_seqs: int = 1024):
    """(iteration s, decodes, ttft s, why infeasible or '') at the given rates on one engine
    of `budget` tokens and `max_seqs` rows an iteration."""
    t = gm.decode_only_s(1, int(P))
    ctx = P + O / 2
    for _ in range(60):
        B = lam_decode * O * t
        pre = lam_prefill * P * t
        if B + pre > budget or B > max_seqs:
            return t, B, math.inf, "budget"
        shape = BatchShape(num_tokens=int(B + pre) + 1,
                           prefill_chunks=np.array([max(int(pre), 1)], dtype=np.int64),
                           prefill_ctx=np.array([int(P / 2)], dtype=np.int64),
                           num_decodes=round(B), decode_ctx_sum=int(round(B) * ctx),
                           num_sample_rows=round(B) + 1)
        t_new = gm.step_s(shape)
        done = abs(t_new - t) <= 1e-4 * t
        t = t_new
        if done:
            break
    else:
        return t, B, math.inf, "budget"
    if (B + 1) * ctx > kv_tokens:
        return t, B, math.inf, "kv"
    rho = (B + pre) / budget
    chunks = math.ceil(P / sp / max(budget - B, 1))
    return t, B, (chunks + 1) * t / max(1 - rho, 1e-6), ""


class Estimator:
    """Capacity estimates for one plan's candidates (cost models and results cached)."""

    def __init__(self, spec, stats: WorkloadStats):
        self.spec, self.stats = spec, stats
        self.itl_s = min(x for x in (spec.slo.get("tbt_ms"), spec.slo.get("tpot_ms"))
                         if x is not None) / 1e3
        self.ttft_s = float(spec.slo["ttft_ms"]) / 1e3
        self._cache: dict = {}

    def _fits(self, res) -> str:
        t, _, ttft, why = res
        if why:
            return why
        if t > self.itl_s:
            return "itl"
        return "ttft" if ttft > self.ttft_s else ""

    def _max_rate(self, check) -> tuple[float, str]:
        """The highest λ with check(λ) == '' by geometric bisection, and the bound met above it."""
        lo, hi = RATE_LO, RATE_HI
        why_hi = check(hi) or "none"
        if why_hi == "none":
            return hi, "none"
        if check(lo):
            return 0.0, check(lo)
        while hi / lo > 1 + RATE_RTOL:
            mid = math.sqrt(lo * hi)
            why = check(mid)
            if why:
                hi, why_hi = mid, why
            else:
                lo = mid
        return lo, why_hi

    def capacity(self, c: Candidate) -> Estimate:
        key = (c.base, c.cpu, c.cpu_cores)
        if key not in self._cache:
            self._cache[key] = self._capacity(c)
        return self._cache[key]

    def _engine(self, c: Candidate, tp: int, s: Settings, gpu: str | None = None):
        model = get_model(c.model)
        if gpu is not None:   # a pool of another kind: its own profile's links
            return gpu_model(c.model, gpu, tp, None), _kv_tokens(model, gpu, tp, s)
        return gpu_model(c.model, c.gpu, tp, c.nvlink), _kv_tokens(model, c.gpu, tp, s)

    def _capacity(self, c: Candidate) -> Estimate:
        P, O, o, G = self.stats.mean_prompt, self.stats.mean_output, c.opts, c.num_gpus
        if c.design == "distserve":
            return self._distserve(c)
        s = settings(c)
        if c.design in ("dualpace", "neo"):
            tp, sp, mult = G, 1, 1
            lam_c = self._cpu_rate(c)
        elif c.design == "conflux":
            tp = int(o.get("tp", 1))
            mult, sp, lam_c = G // tp, G // (int(o.get("instances", 1)) * tp), 0.0
        else:
            tp = int(o.get("tp", 1))
            mult, sp, lam_c = G // tp, 1, 0.0
        gm, kv = self._engine(c, tp, s)

        def check(lam):
            return self._fits(steady(gm, lam, max(lam - lam_c, 0.0), P, O, s.budget, kv, sp,
                                     s.max_seqs))
        lam, why = self._max_rate(check)
        t, _, ttft, _ = steady(gm, lam, max(lam - lam_c, 0.0), P, O, s.budget, kv, sp, s.max_seqs)
        return Estimate(lam * mult, t, ttft, why)

    def _distserve(self, c: Candidate) -> Estimate:
        P, O, o = self.stats.mean_prompt, self.stats.mean_output, c.opts
        n_pre, (dgpu, n_dec), handoff = c.num_gpus // 2, (None, c.num_gpus // 2), 0.0
        if c.decode_pool:   # a decode pool of its own: prefill gets every GPU of num_gpus
            n_pre, (dgpu, n_dec) = c.num_gpus, c.decode_pool
            handoff = self._handoff_s(c, P)
        ptp, dtp = int(o.get("prefill_tp") or n_pre), int(o.get("decode_tp") or n_dec)
        sd = decode_settings(c, dgpu)
        gp, _ = self._engine(c, ptp, settings(c))
        gd, kv = self._engine(c, dtp, sd, dgpu)
        s_p, n_p, n_d = gp.prefill_only_s(int(P)), n_pre // ptp, n_dec // dtp

        def check(lam):
            rho = lam * s_p / n_p
            if rho >= 1:
                return "prefill"
            if s_p / (1 - rho) + handoff > self.ttft_s:
                return "ttft"
            return self._fits(steady(gd, 0.0, lam / n_d, P, O, sd.budget, kv,
                                     max_seqs=sd.max_seqs))
        lam, why = self._max_rate(check)
        t, _, _, _ = steady(gd, 0.0, lam / n_d, P, O, sd.budget, kv, max_seqs=sd.max_seqs)
        return Estimate(lam, t, s_p / max(1 - lam * s_p / n_p, 1e-6), why)

    def _handoff_s(self, c: Candidate, P: float) -> float:
        """An isolated prompt's KV crossing the inter-node link (its shards in parallel)."""
        o = c.opts
        ln = load_profile(str(policy_config(c.policy, c.options).handoff_link),
                          expect_kind="link").link
        assert c.decode_pool is not None
        shards = max(int(o.get("prefill_tp") or c.num_gpus),
                     int(o.get("decode_tp") or c.decode_pool[1]))
        nbytes = P * get_model(c.model).kv_bytes_per_token / shards
        return ln["latency_us"] * 1e-6 + nbytes / (ln["p2p_gbps"] * 1e9)

    def _cpu_rate(self, c: Candidate) -> float:
        """Requests/s the CPU tier can decode at the TBT target within the host KV pool."""
        from simserve.cost.cpu import CpuCostModel
        assert c.cpu is not None   # infeasible() prunes CPU-tier designs without a host CPU
        model = get_model(c.model)
        cm = CpuCostModel(model, load_profile(c.cpu), c.host_cores(), int(c.opts.get("cpu_tp", 1)))
        ctx = self.stats.mean_prompt + self.stats.mean_output / 2
        host_tokens = c.host_gib() * 2**30 / model.kv_bytes_per_token
        best = 0.0
        b = 1
        while b <= 1024 and b * ctx <= host_tokens:
            t = float(cm.iteration_s(b, b * ctx))
            if t > self.itl_s:
                break
            best = max(best, b / (self.stats.mean_output * t))
            b *= 2
        return best
