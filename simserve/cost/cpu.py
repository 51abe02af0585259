"""CPU decode cost model: the time of one CPU decode iteration (DualPace's CPU engine, NEO's
CPU attention side), stage by stage, from a CPU profile's tables.

    t_iter = pre_layer(b) + L · [pre_attention(b) + attention(b, ΣC) + post_attention(b)]
           + post_layer(b)

b decode rows (one token each), ΣC their total context. With `cpu_tp` ranks of `cores/cpu_tp`
cores each, every rank holds 1/cpu_tp of the heads, KV heads, FFN columns and vocabulary, and
runs the profile's tables at `cores/cpu_tp` cores on its shard (time = table / cpu_tp: the
shard streams 1/cpu_tp of the weights and KV, and does 1/cpu_tp of the FLOPs). Ranks are
taken as NUMA-local, each with its own memory bandwidth (DualPace §5: "rank-sharded and
NUMA-local"; §6.3: 12 cores per rank, one NUMA node each); DRAM contention between ranks
that share a socket is not modelled.

What the profile does not measure is priced from the host copy bandwidth (bytes copied per
second, the profile's `stream_copy` ceiling; see `host_copy_gbps`), one copy per byte read and
written once:
  - embedding lookup: one copy of b·hidden activations (+ a Gloo all-reduce under TP,
    vocab-parallel embedding as in vLLM);
  - RMSNorm with fused residual add (vLLM's fused_add_rms_norm): two copies of b·hidden
    (reads x and residual, writes both); RoPE on q and k, Qwen3's q/k norm and the KV-cache
    append: one copy of their bytes each; SiLU·mul: 1.5 copies of b·ffn/cpu_tp (reads 2, writes 1);
  - sampling: one pass over b·vocab fp32 logits;
  - Gloo collectives: `gloo_latency_us` + ring traffic 2(t−1)/t · bytes per all-reduce,
    (t−1) · shard bytes for the logits gather to rank 0, at the copy bandwidth.
Host overheads (`iteration_us`, `per_seq_us` from the profile's `overheads`, 0 when absent)
are charged once per iteration in the pre-layer stage.
"""
from __future__ import annotations

import csv
from dataclasses import replace

import numpy as np

from simserve.cost import assist_routes
from simserve.cost.gpu import in_situ_factor
from simserve.errors import ConfigError
from simserve.hardware.datasheets import CPU_EFFICIENCY
from simserve.hardware.profile import HardwareProfile, link_curve
from simserve.paths import REPO_ROOT
from simserve.models import DTYPE_BYTES, ModelSpec

# Small-message Gloo ring all-reduce: 39-50 µs for 1-8 KB (pytorch/gloo issue #158, gloo's
# own benchmark). An assumption for same-host ranks until `simserve calibrate` measures it.
GLOO_LATENCY_US = 40.0
LOGIT_BYTES = 4          # sampling reads fp32 logits
STAGES = ("pre_layer", "pre_attention", "attention", "post_attention", "post_layer")


def host_copy_gbps(cpu: HardwareProfile, cores: int) -> tuple[float, str]:
    """Host copy bandwidth (GB/s of bytes copied) available to `cores` cores, and its source.

    Measured profiles: the best `stream_copy` point at that thread count, which `simserve
    calibrate fit` stores as `overheads.host_copy_gbps` (the ceiling `rescale` uses); a profile
    fitted before that field existed is read from its raw points when run from a checkout.
    Otherwise the datasheet × efficiency figure that derived profiles were scaled to:
    min(DRAM peak × memory efficiency, cores × per-core GB/s) (`datasheets.CPU_EFFICIENCY`)."""
    raw = cpu.provenance.get("raw")
    stored = (cpu.overheads.get("host_copy_gbps") or {}) if cpu.provenance_type == "measured" else {}
    if cores in stored:
        return float(stored[cores]), f"measured stream_copy at {cores} threads (profile)"
    if cpu.provenance_type == "measured" and raw:
        path = REPO_ROOT / raw / "cpu_ops.csv"
        if path.exists():
            with open(path, newline="") as f:
                rates = [float(r["bytes"]) / float(r["median_us"]) / 1e3 for r in csv.DictReader(f)
                         if r["op"] == "stream_copy" and r["threads"]
                         and int(float(r["threads"])) == cores]
            if rates:
                return max(rates), f"measured stream_copy at {cores} threads ({path.name})"
    peak = cpu.spec.get("dram_gbps_peak")
    if peak is None:
        raise ConfigError(f"{cpu.path}: spec.dram_gbps_peak is needed to price CPU memory-bound ops")
    gbps = min(float(peak) * CPU_EFFICIENCY["memory"], cores * CPU_EFFICIENCY["per_core_gbps"])
    return gbps, "datasheet x efficiency (as derived profiles are scaled)"


class CpuCostModel:
    """Stage times (µs) and iteration times (s) of CPU decode batches."""

    def __init__(self, model: ModelSpec, cpu_profile: HardwareProfile, cores: int,
                 cpu_tp: int = 1, link: HardwareProfile | None = None,
                 gloo_latency_us: float = GLOO_LATENCY_US, host_gbps: float | None = None):
        if cpu_profile.kind != "cpu":
            raise ConfigError(f"{cpu_profile.path}: profile {cpu_profile.name!r} is a "
                              f"{cpu_profile.kind}, expected a cpu")
        if cpu_tp < 1 or cores < cpu_tp or cores % cpu_tp:
            raise ConfigError(f"cpu_tp: {cpu_tp} ranks must evenly divide {cores} cores")
        try:
            model.check_tp(cpu_tp)
        except ValueError as exc:
            raise ConfigError(f"cpu_tp: {exc}") from None
        if model.ffn % cpu_tp:
            raise ConfigError(f"cpu_tp: {cpu_tp} must divide {model.name}'s FFN width {model.ffn}")
        per = cores // cpu_tp
        have = cpu_profile.cpu_core_counts(model.name)
        if per not in have:
            raise ConfigError(
                f"{cpu_profile.path}: ops.{model.name}: CPU TP {cpu_tp} over {cores} cores needs "
                f"tables at {per} cores per rank; this profile has core counts {have or 'none'}")
        self.model, self.cpu, self.cores, self.tp, self.cores_per_rank = (
            model, cpu_profile, cores, cpu_tp, per)
        self.num_layers = model.num_layers
        self.ops = cpu_profile.cpu_ops(model.name, per)
        if host_gbps is None:
            host_gbps, self.host_gbps_source = host_copy_gbps(cpu_profile, per)
        else:
            self.host_gbps_source = "given"
        self.host_gbps = float(host_gbps)
        self._bpu = self.host_gbps * 1e3          # bytes per µs
        oh = cpu_profile.overheads
        self.iter_us = float(oh.get("iteration_us", 0.0))
        self.per_seq_us = float(oh.get("per_seq_us", 0.0))
        self.gloo_latency_us = float(gloo_latency_us)
        self._ar_table = link_curve(link, f"allreduce_ranks{cpu_tp}") if (
            link is not None and cpu_tp > 1) else None
        if link is not None and self._ar_table is None and cpu_tp > 1:
            ln = link.link
            self.gloo_latency_us = float(ln.get("collective_latency_us",
                                                ln.get("latency_us", self.gloo_latency_us)))
        self.decode_attn = self.ops.decode_attn.us
        situ = cpu_profile.overheads.get("in_situ")
        # a model's own factor where one was fitted on its runs, else the profile's
        self._situ = (situ or {}).get("by_model", {}).get(model.name, situ)
        self._situ_at: dict[int, float] = {}  # factor by decode batch, computed once each

    # -- pieces ---------------------------------------------------------------------------
    def copy_us(self, nbytes: float) -> float:
        """Memory-bound elementwise work that reads and writes `nbytes` once."""
        return nbytes / self._bpu

    def allreduce_us(self, rows: int) -> float:
        """One Gloo all-reduce of `rows` bf16 hidden vectors across the CPU TP ranks."""
        if self.tp == 1:
            return 0.0
        nbytes = rows * self.model.hidden * DTYPE_BYTES
        if self._ar_table is not None:
            return float(self._ar_table(nbytes))
        return self.gloo_latency_us + 2.0 * (self.tp - 1) / self.tp * nbytes / self._bpu

    def gemm_us(self, b: int) -> float:
        """qkv + o + gate_up + down of one layer on one rank (the weight-streaming part)."""
        return sum(float(self.ops.dense[o](b)) for o in ("qkv", "o", "gate_up", "down")) / self.tp

    def lm_head_us(self, b: int) -> float:
        return float(self.ops.lm_head(b)) / self.tp

    # -- stages (µs) ----------------------------------------------------------------------
    def pre_layer_us(self, b: int) -> float:
        """Host overheads + embedding lookup (+ its all-reduce under TP)."""
        m = self.model
        return (self.iter_us + self.per_seq_us * b
                + self.copy_us(b * m.hidden * DTYPE_BYTES) + self.allreduce_us(b))

    def pre_attention_us(self, b: int) -> float:
        """One layer: fused add+RMSNorm, QKV GEMM, (q/k norm,) RoPE, KV-cache append."""
        m, t = self.model, self.tp
        qk = (m.num_heads + m.num_kv_heads) // t * m.head_dim * b * DTYPE_BYTES
        kv = 2 * m.num_kv_heads // t * m.head_dim * b * DTYPE_BYTES
        elem = 2 * b * m.hidden * DTYPE_BYTES + qk * (2 if m.qk_norm else 1) + kv
        return float(self.ops.dense["qkv"](b)) / t + self.copy_us(elem)

    def attention_us(self, b: int, ctx_sum):
        """One layer of CPU paged decode attention on one rank's KV heads (array-friendly)."""
        return self.decode_attn(b, ctx_sum) / self.tp

    def post_attention_us(self, b: int) -> float:
        """One layer: o GEMM + all-reduce, fused add+RMSNorm, gate_up, SiLU·mul, down +
        all-reduce (what a Dense Assist post-attention call replaces)."""
        m, t = self.model, self.tp
        gemm = sum(float(self.ops.dense[o](b)) for o in ("o", "gate_up", "down")) / t
        elem = 2 * b * m.hidden * DTYPE_BYTES + 1.5 * b * (m.ffn // t) * DTYPE_BYTES
        return gemm + self.copy_us(elem) + 2.0 * self.allreduce_us(b)

    def post_layer_us(self, b: int) -> float:
        """Final fused add+RMSNorm, LM head (+ logits gather to rank 0), sampling."""
        m, t = self.model, self.tp
        us = self.copy_us(2 * b * m.hidden * DTYPE_BYTES) + self.lm_head_us(b)
        if t > 1:
            shard = b * -(-m.vocab // t) * DTYPE_BYTES
            us += self.gloo_latency_us + (t - 1) * shard / self._bpu
        return us + self.copy_us(b * m.vocab * LOGIT_BYTES)

    def stage_us(self, b: int, ctx_sum) -> dict:
        """Stage times in µs; the three layer stages are per layer:
        iteration = pre_layer + L·(pre_attention + attention + post_attention) + post_layer.
        Every stage but the host overhead is scaled by the profile's in-situ factor of b."""
        f = self.in_situ(b)
        host = self.iter_us + self.per_seq_us * b
        return {"pre_layer": host + (self.pre_layer_us(b) - host) * f,
                "pre_attention": self.pre_attention_us(b) * f,
                "attention": self.attention_us(b, ctx_sum) * f,
                "post_attention": self.post_attention_us(b) * f,
                "post_layer": self.post_layer_us(b) * f}

    def stage_fn(self, b: int):
        """`stage_us(b, ·)` as a function of `ctx_sum` alone, the stages that depend on b alone
        computed once (the same floats: the same operations on the same values)."""
        f = self.in_situ(b)
        host = self.iter_us + self.per_seq_us * b
        pre_layer = host + (self.pre_layer_us(b) - host) * f
        pre_attention = self.pre_attention_us(b) * f
        post_attention = self.post_attention_us(b) * f
        post_layer = self.post_layer_us(b) * f

        def stages(ctx_sum) -> dict:
            return {"pre_layer": pre_layer, "pre_attention": pre_attention,
                    "attention": self.attention_us(b, ctx_sum) * f,
                    "post_attention": post_attention, "post_layer": post_layer}
        return stages

    def in_situ(self, b: int) -> float:
        """Whole CPU iterations (real executor) over the sum of separately priced ops at batch
        b: the profile's `overheads.in_situ` (`simserve validate fit`; its `by_model` entry for
        this model where there is one), 1 without one."""
        if self._situ is None:
            return 1.0
        f = self._situ_at.get(b)
        if f is None:
            f = self._situ_at[b] = float(in_situ_factor(self._situ, np.array([b]))[0])
        return f

    def iteration_s(self, b: int, ctx_sum):
        """One CPU decode iteration in seconds; `ctx_sum` may be an array (same floats as the
        scalar path, element by element)."""
        if b == 0:
            return 0.0 * ctx_sum
        s = self.stage_us(b, ctx_sum)
        layer = s["pre_attention"] + s["attention"] + s["post_attention"]
        return (s["pre_layer"] + self.num_layers * layer + s["post_layer"]) * 1e-6

    # -- Dense Assist ---------------------------------------------------------------------
    def assist_route_times(self, gpu_ops, pcie: HardwareProfile, batches,
                           host_us: float = assist_routes.ASSIST_HOST_US, wait_us: float = 0.0):
        """`assist_routes.route_times_from` with the CPU-local stages (t_p, t_l) priced by this
        model (norms, TP shards and collectives included) instead of the raw GEMM tables."""
        rt = assist_routes.route_times_from(gpu_ops, self.ops, pcie, self.model, batches,
                                            host_us=host_us, wait_us=wait_us)
        return replace(rt, t_p=np.array([self.post_attention_us(b) for b in batches]) / 1e3,
                       t_l=np.array([self.post_layer_us(b) for b in batches]) / 1e3)
