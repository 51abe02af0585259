"""Kernel time on a share f of a GPU's SMs, from the profile's fitted full-GPU functions.

Every kernel time t measured (fitted) on the whole GPU is split, as `hardware/rescale.py`
does for derived devices, into a fixed floor (min(t, 4 µs): launch and tail) and a roofline
part that is scaled by

    ratio(f) = max(F / (c(f)·P), B / (bw(f)·W)) / max(F / P, B / W)

with F and B the FLOPs and HBM bytes of the kernel at that shape (from the model's GEMM and
attention shapes), P and W the datasheet bf16 peak and HBM bandwidth of the GPU, and c(f),
bw(f) the shares of whole-GPU compute and memory throughput that f of the SMs deliver:
- measured (the profile's `overheads.sm_share`, from `simserve.calibrate.smshare` runs on
  green-context partitions: piecewise linear in f). On the H200, 16 of 132 SMs keep 26 % of
  the memory throughput and 15 % of the compute (more per SM than the whole GPU: higher
  clocks), 112 SMs only 73 % of the compute (wave quantisation of some shapes);
- or analytic (no measured curves, or `bw_saturation` set): c(f) = f and
  bw(f) = min(1, f / bw_saturation), memory-bound kernels saturating HBM before they hold
  every SM (ConfluxServe §6.1 sizes decode's SM share by "the minimum SMs that sustain 90 % of
  its standalone HBM bandwidth").
TP all-reduces keep their measured time: NCCL runs its own channels. Host costs, the launch
model and the in-situ factor follow `GpuCostModel.step_s`.

`contention(curves, f)` gives the co-running slowdowns alpha (decode) and beta (prefill) at a
decode share f: measured ones from the same curves, else the paper-derived constant.
"""
from __future__ import annotations

import numpy as np

from simserve.cost.gpu import BatchShape, GpuCostModel
from simserve.models import DTYPE_BYTES

FLOOR_MAX_US = 4.0  # the kernel floor `rescale.py` keeps

# ConfluxServe Fig. 14a: overlapping prefill and decode attention on partitioned SMs took 28.0 ms
# where serial execution took 36.5 ms, closing 58 % of the gap to the contention-free bound,
# which is therefore 36.5 - 8.5 / 0.58 = 21.8 ms: concurrent streams ran 28.0 / 21.8 = 1.28x
# slower than without interference. Used where no measured co-run slowdown exists.
CONTENTION_FIG14A = round(28.0 / (36.5 - (36.5 - 28.0) / 0.58), 3)


def contention(curves: dict | None, f: float) -> tuple[float, float]:
    """(alpha, beta) at decode share f: the measured curves' (flat beyond their ends), else
    the Fig. 14a constant for both."""
    if not curves or "decode_contention" not in curves:
        return CONTENTION_FIG14A, CONTENTION_FIG14A
    x = curves["corun_decode_fraction"]
    return (float(np.interp(f, x, curves["decode_contention"])),
            float(np.interp(f, x, curves["prefill_contention"])))


class SmShareCost:
    """`curves`: the profile's measured `sm_share` (None: analytic with `bw_saturation`)."""

    def __init__(self, cost: GpuCostModel, bw_saturation: float, curves: dict | None = None):
        self.cost, self.m, self.tp = cost, cost.model, cost.tp
        spec = cost.gpu.spec
        self.P = float(spec["bf16_tflops"]) * 1e12
        self.W = float(spec["mem_bandwidth_gbps"]) * 1e9
        self.bw_sat = bw_saturation
        self.use_curves(curves)
        self.gemms = {g.name: g for g in self.m.gemms(self.tp)}
        self.lm = self.m.lm_head(self.tp)
        self.nh, self.nkv = self.m.heads_per_rank(self.tp)

    def use_curves(self, curves: dict | None) -> None:
        """Price shares with these measured curves (None: the analytic model)."""
        self.curves = curves
        self._memo: dict = {}  # (what, tokens, f, ...) -> µs of dense_us / lm_us, priced on these curves
        if curves:
            self._f = np.concatenate([[0.0], curves["sm_fraction"]])
            self._bw = np.concatenate([[0.0], curves["bw_fraction"]])
            self._cf = np.concatenate([[0.0], curves["compute_fraction"]])

    def bw(self, f: float) -> float:
        """Share of whole-GPU memory throughput on share f of the SMs."""
        if self.curves:
            return float(np.interp(f, self._f, self._bw))
        return min(1.0, f / self.bw_sat)

    def compute(self, f: float) -> float:
        """Share of whole-GPU compute throughput on share f of the SMs."""
        if self.curves:
            return float(np.interp(f, self._f, self._cf))
        return f

    def _scaled(self, t_us: float, flops: float, nbytes: float, f: float) -> float:
        if f >= 1.0:
            return t_us
        full = max(flops / self.P, nbytes / self.W)
        if full <= 0:
            return t_us
        share = max(flops / (self.compute(f) * self.P), nbytes / (self.bw(f) * self.W))
        floor = min(t_us, FLOOR_MAX_US)
        return floor + (t_us - floor) * share / full

    def _gemm(self, g, t_us: float, tokens: float, f: float) -> float:
        return self._scaled(t_us, 2.0 * tokens * g.k * g.n,
                            (g.k * g.n + tokens * (g.k + g.n)) * DTYPE_BYTES, f)

    def dense_us(self, tokens: int, f: float, allreduce: bool = True) -> float:
        """One layer's linear ops, element-wise ops and (unless not `allreduce`) TP
        all-reduces on share f (memoised: a decode batch keeps its size for many steps)."""
        key = ("dense", tokens, f, allreduce)
        us = self._memo.get(key)
        if us is not None:
            return us
        if len(self._memo) > 1 << 16:
            self._memo.clear()
        ops = self.cost.ops.dense
        us = 0.0
        for name, curve in ops.items():
            t = float(curve(tokens))
            if name in self.gemms:
                us += self._gemm(self.gemms[name], t, tokens, f)
            else:  # element-wise: memory-bound
                us += self._scaled(t, 0.0, 1.0, f)
        us = self._memo[key] = us + (2.0 * float(self.cost.allreduce_us(tokens)) if allreduce
                                     else 0.0)
        return us

    def lm_us(self, rows: int, f: float) -> float:
        key = ("lm", rows, f)
        us = self._memo.get(key)
        if us is None:
            us = self._memo[key] = self._gemm(self.lm, float(self.cost.ops.lm_head(rows)), rows, f)
        return us

    def decode_layer_us(self, batch: int, ctx_sum: int, f: float, ctx_max: int | None = None,
                        allreduce: bool = True) -> float:
        """One layer of a decode iteration (`batch` sequences, Σ context `ctx_sum`, longest
        `ctx_max`) on share f."""
        hd = self.m.head_dim
        attn = self._scaled(float(self.cost.decode_attn(batch, ctx_sum, ctx_max)),
                            4.0 * self.nh * hd * ctx_sum,
                            2.0 * ctx_sum * self.nkv * hd * DTYPE_BYTES, f)
        return self.dense_us(batch, f, allreduce) + attn

    def prefill_layer_us(self, chunk: int, ctx: int, f: float, allreduce: bool = True) -> float:
        """One layer of one prefill chunk of `chunk` tokens after `ctx` cached ones, on share f."""
        hd = self.m.head_dim
        work = chunk * (ctx + (chunk + 1.0) / 2.0)  # causal query-key pairs
        attn = self._scaled(float(self.cost.prefill_attn(np.array([chunk]), np.array([ctx]))),
                            4.0 * self.nh * hd * work,
                            (2.0 * chunk * self.nh + 2.0 * (ctx + chunk) * self.nkv) * hd
                            * DTYPE_BYTES, f)
        self.cost._ensure(chunk)
        return self.dense_us(chunk, f, allreduce) + attn

    def decode_step_s(self, batch: int, ctx_sum: int, f: float, ctx_max: int | None = None) -> float:
        """A decode iteration of `batch` sequences with Σ context `ctx_sum` (longest `ctx_max`)
        on share f."""
        if f >= 1.0:
            return float(self.cost.decode_only_s(batch, ctx_sum, ctx_max))
        layer = self.decode_layer_us(batch, ctx_sum, f, ctx_max)
        return self._iteration_s(batch, batch, layer, self.lm_us(batch, f))

    def decode_steps_s(self, batch: int, ctx_sum: np.ndarray, f: float,
                       ctx_max: np.ndarray) -> np.ndarray:
        """`decode_step_s` over arrays of Σ context and longest context (consecutive steps of
        one batch): every operation elementwise, so each element is the scalar call's float."""
        ctx_sum = np.asarray(ctx_sum, dtype=np.int64)
        if f >= 1.0:
            return np.asarray(self.cost.decode_only_s(batch, ctx_sum, ctx_max), dtype=np.float64)
        t = np.asarray(self.cost.decode_attn(batch, ctx_sum, ctx_max), dtype=np.float64)
        return self._decode_steps_on_share(batch, ctx_sum, t, f)

    def _decode_steps_on_share(self, batch: int, ctx_sum: np.ndarray, t: np.ndarray,
                               f: float) -> np.ndarray:
        """Decode steps of Σ contexts `ctx_sum` on share f < 1, from their whole-GPU attention
        times `t` (µs per layer)."""
        hd = self.m.head_dim
        flops = 4.0 * self.nh * hd * ctx_sum
        nbytes = 2.0 * ctx_sum * self.nkv * hd * DTYPE_BYTES
        full = np.maximum(flops / self.P, nbytes / self.W)
        share = np.maximum(flops / (self.compute(f) * self.P), nbytes / (self.bw(f) * self.W))
        floor = np.minimum(t, FLOOR_MAX_US)
        attn = np.where(full <= 0, t, floor + (t - floor) * share / np.where(full > 0, full, 1.0))
        layer = self.dense_us(batch, f, True) + attn
        return np.asarray(self._iteration_s(batch, batch, layer, self.lm_us(batch, f)),
                          dtype=np.float64)

    def prefill_s(self, prompts: np.ndarray, f: float) -> float:
        """Whole prompts (no cached context) in one batch on share f."""
        T, n = int(prompts.sum()), len(prompts)
        if f >= 1.0:
            return self.cost.step_s(prefill_shape(prompts))
        c = prompts.astype(np.float64)
        zeros = np.zeros(n, dtype=np.int64)
        hd = self.m.head_dim
        work = float((c * (c + 1.0) / 2.0).sum())
        attn = self._scaled(float(self.cost.prefill_attn(prompts, zeros)),
                            4.0 * self.nh * hd * work,
                            float((2 * c * self.nh + 2 * c * self.nkv).sum()) * hd * DTYPE_BYTES, f)
        self.cost._ensure(T)
        layer = self.dense_us(T, f) + attn
        return self._iteration_s(T, n, layer, self.lm_us(n, f))

    def _iteration_s(self, tokens, num_seqs, layer_us, lm_us):
        """Host overhead + launch model + LM head, scaled by the in-situ factor, as in
        `GpuCostModel.step_s` but with the share's own LM head time."""
        c = self.cost
        fwd = (c.layers_us(tokens, layer_us) + lm_us) * c.in_situ(tokens)
        return (c.iter_us + c.per_seq_us * num_seqs + fwd) * 1e-6


def prefill_shape(prompts: np.ndarray) -> BatchShape:
    return BatchShape(num_tokens=int(prompts.sum()), prefill_chunks=prompts,
                      prefill_ctx=np.zeros(len(prompts), dtype=np.int64),
                      num_sample_rows=len(prompts))
