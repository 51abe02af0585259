"""Published measurements that a derived CPU profile is anchored to, and the profile's residual
against each.

A derived CPU profile (rescaled from the measured `xeon-emr` tables, `rescale.py`) describes a
part nobody here can run. Its compute-bound regime is set so that the profile reproduces one
published measurement of that part or of its generation (an anchor with `fit: true`); other
anchors are checks. Each anchor is stored in the profile's `provenance.anchors` with its
source, date and value, and `simserve profiles check` prints

    residual = prediction from the profile's own tables / published value − 1

Quantities (all predicted from the profile's tables, never copied from the anchor):

- `cpu_layer_decode_tokens_per_s`: decode throughput of one decoder layer on the CPU (the
  four dense ops plus paged decode attention, as DualPace's profiler measures it) at `batch`
  requests, averaged over `contexts` (tokens of context per request);
- `gemm_tflops_per_core`: the best dense FLOP rate of the profile's GEMM tables over token
  counts ≥ 256 (compute-bound shapes), per core;
- `cpu_gpu_gemm_ratio`: CPU time / GPU time of the named ops (`ops`) of `model`, geometric
  mean over `tokens`, against the named GPU profile (TP1).

An anchor's `range` (when given) is what the publication supports (a figure read off its
axis, or "roughly one order of magnitude" taken as half a decade either side); a prediction
inside it is `within`.
"""
from __future__ import annotations

import math

import numpy as np

from simserve.models import get_model

DUALPACE = ("DualPace: Decoupled Scheduling and Cooperative GPU-CPU Decoding for LLM Serving "
            "(Lin et al., arXiv, 2026; ../shared/seeds/dualpace.txt)")
LIA = ("LIA (Kim et al., ISCA 2025, doi:10.1145/3695053.3731092), abstract: AMX bf16 matrix "
       "multiplication at 20 TFLOPS on Sapphire Rapids")

# DualPace Fig. 7b: one Llama-3.1-8B layer on 12 cores of a Xeon Silver 4510 decodes about
# 12-15 K tokens/s at batch 256 (its peak; context lengths 64-512; read off the figure's axis)
FIG7B = {"id": "dualpace-fig7b", "quantity": "cpu_layer_decode_tokens_per_s",
         "model": "llama-3.1-8b", "cores": 12, "batch": 256, "contexts": [64, 128, 256, 512],
         "value": 13500.0, "range": [12000.0, 15000.0], "unit": "tokens/s",
         "source": f"{DUALPACE}, Fig. 7b (CPU single-layer decode throughput, Xeon Silver 4510, "
                   "12 cores; 12-15 K tokens/s at batch 256, read off the figure)",
         "date": "2026"}
# DualPace Fig. 3 (bottom) and §2.3: packed QKV and FFN gate/up on the 4510's 12 cores vs an
# RTX 4090, 1-1,024 tokens: "AMX narrows the gap to roughly one order"
FIG3 = {"id": "dualpace-fig3", "quantity": "cpu_gpu_gemm_ratio", "model": "llama-3.1-8b",
        "cores": 12, "gpu": "rtx4090", "ops": ["qkv", "gate_up"],
        "tokens": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
        "value": 10.0, "range": [10 ** 0.5, 10 ** 1.5], "unit": "x (CPU time / GPU time)",
        "source": f"{DUALPACE}, Fig. 3 and §2.3 (\"AMX narrows the gap to roughly one order\")",
        "date": "2026"}
# LIA's abstract gives 20 TFLOPS for a Sapphire Rapids socket without the core count; the
# LIA repository's example command pins 40 cores of one socket (notes §3.2, uncertain), so
# 0.5 TFLOP/s per core
LIA_PER_CORE = {"id": "lia-isca25", "quantity": "gemm_tflops_per_core", "value": 0.5,
                "unit": "TFLOP/s per core",
                "source": f"{LIA}; per core over the 40 cores LIA's repository example pins "
                          "(core count uncertain; ../shared/notes/hardware-and-models.md §3.2)",
                "date": "2025-06"}

# the anchors of each derived CPU profile; `fit: true` sets its compute-bound regime
ANCHORS: dict[str, list[dict]] = {
    "xeon-silver-4510": [dict(FIG7B, fit=True), dict(FIG3, fit=False),
                         dict(LIA_PER_CORE, fit=False)],
    "xeon-8469c": [dict(LIA_PER_CORE, fit=True)],
}
QUANTITIES = ("cpu_layer_decode_tokens_per_s", "gemm_tflops_per_core", "cpu_gpu_gemm_ratio")


def _gemm_flops(model: str, op: str, tokens: float) -> float:
    g = {x.name: x for x in (*get_model(model).gemms(1), get_model(model).lm_head(1))}[op]
    return 2.0 * tokens * g.k * g.n


def _layer_tokens_per_s(cpu, a: dict) -> float:
    ops = cpu.cpu_ops(a["model"], int(a["cores"]))
    b = int(a["batch"])
    dense = sum(float(c(b)) for c in ops.dense.values())
    thr = [b / (dense + float(ops.decode_attn.us(b, b * c))) * 1e6 for c in a["contexts"]]
    return float(np.mean(thr))


def _tflops_per_core(cpu, a: dict) -> float:
    best = 0.0
    for model in cpu.models():
        for cores in cpu.cpu_core_counts(model):
            if a.get("cores") and cores != int(a["cores"]):
                continue
            ops = cpu.cpu_ops(model, cores)
            t = cpu.raw_ops[model][f"cores{cores}"]["tokens"]
            for op, curve in ops.dense.items():
                for n in (x for x in t if x >= 256):
                    best = max(best, _gemm_flops(model, op, n) / float(curve(n)) / 1e6 / cores)
    return best


def _gpu_ratio(cpu, a: dict, gpu=None) -> float:
    from simserve.hardware.profile import load_profile
    gpu = gpu or load_profile(a["gpu"], expect_kind="gpu")
    c = cpu.cpu_ops(a["model"], int(a["cores"])).dense
    g = gpu.ops(a["model"], 1).dense
    logs = [math.log(float(c[op](n)) / float(g[op](n))) for op in a["ops"] for n in a["tokens"]]
    return math.exp(sum(logs) / len(logs))


def predict(cpu, anchor: dict, gpu=None) -> float:
    """The anchor's quantity predicted from the CPU profile's tables (`cpu`: a HardwareProfile)."""
    q = anchor["quantity"]
    if q == "cpu_layer_decode_tokens_per_s":
        return _layer_tokens_per_s(cpu, anchor)
    if q == "gemm_tflops_per_core":
        return _tflops_per_core(cpu, anchor)
    if q == "cpu_gpu_gemm_ratio":
        return _gpu_ratio(cpu, anchor, gpu)
    raise ValueError(f"anchor {anchor.get('id')!r}: unknown quantity {q!r} (expected one of "
                     f"{', '.join(QUANTITIES)})")


def _where(a: dict) -> str:
    parts = [a["model"]] if "model" in a else []
    if "cores" in a:
        parts.append(f"{a['cores']} cores")
    if "batch" in a:
        parts.append(f"batch {a['batch']}")
    if "gpu" in a:
        parts.append(f"vs {a['gpu']}")
    return ", ".join(parts) or "every table"


def residuals(cpu) -> list[dict]:
    """One row per anchor in the profile's provenance (a per-core anchor without `cores`: one
    per core count the profile has): value, prediction, residual, within its range."""
    rows = []
    for a0 in cpu.provenance.get("anchors") or []:
        todo = [a0]
        if a0["quantity"] == "gemm_tflops_per_core" and "cores" not in a0:
            counts = sorted({c for m in cpu.models() for c in cpu.cpu_core_counts(m)})
            todo = [dict(a0, cores=c) for c in counts]
        for a in todo:
            pred = predict(cpu, a)
            lo, hi = (a.get("range") or [None, None])
            rows.append({"id": a["id"], "quantity": a["quantity"], "fit": bool(a.get("fit")),
                         "where": _where(a), "value": float(a["value"]), "predicted": pred,
                         "residual": pred / float(a["value"]) - 1.0,
                         "within": None if lo is None else bool(lo <= pred <= hi),
                         "unit": a.get("unit", ""), "source": a["source"], "date": a["date"]})
    return rows


def needs_anchor(profile) -> bool:
    """Derived CPU profiles must name an anchor measurement."""
    return profile.kind == "cpu" and profile.provenance_type == "derived"


def fit_ceiling(build, anchor: dict, lo: float, hi: float, iters: int = 60) -> float:
    """The compute ceiling P (FLOP/s) at which `build(P)` (a profile whose compute-bound regime
    runs at P) meets the anchor's value: bisection in log P (every quantity above grows with P
    except the CPU/GPU ratio, which falls)."""
    sign = -1.0 if anchor["quantity"] == "cpu_gpu_gemm_ratio" else 1.0
    target = float(anchor["value"])

    def f(p):
        return sign * (predict(build(p), anchor) - target)
    if f(lo) > 0 or f(hi) < 0:
        raise ValueError(f"anchor {anchor['id']}: not reachable with a compute ceiling between "
                         f"{lo / 1e12:.2f} and {hi / 1e12:.2f} TFLOP/s (memory-bound part too slow?)")
    a, b = math.log(lo), math.log(hi)
    for _ in range(iters):
        m = 0.5 * (a + b)
        if f(math.exp(m)) < 0:
            a = m
        else:
            b = m
    return math.exp(0.5 * (a + b))
