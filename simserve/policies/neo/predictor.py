"""NEO's performance model and the asymmetric pipeline's iteration time (policies.md §1.3–1.4).

NEO's `TablePerfPredictor` interpolates offline per-layer tables; here the same four per-layer
functions come from our fitted cost models:

    T_lin(S)        dense work of S tokens (QKV, O, FFN, norms; TP all-reduces)   GpuCostModel
    T_pref(l)       GPU prefill attention of one whole prompt of l tokens          GpuCostModel
    T_gdec(B, N)    GPU paged decode attention, B decodes with N KV tokens         GpuCostModel
    T_cdec(B, N)    CPU decode attention over host KV                              CpuCostModel

plus NEO's constant CPU launch term `T_lnch` (a decision margin only). A sub-batch's
gpu_time = T_lin(tokens) + Σ T_pref + T_gdec and cpu_time = T_cdec + T_lnch (0 without CPU
decodes).

Pipeline iteration (DualPace Fig. 4): per layer the GPU runs sub-batch 1's dense work and
sub-batch 0's GPU attention while the CPU runs attention 0, then sub-batch 0's dense work while
the CPU runs attention 1:

    layer = max(T1_lin + T0_ga, T0_ca) + max(T0_lin, T1_ca)

where T_ca also carries the per-layer activation copies of the CPU rows over PCIe (q, k, v
down, attention output up). The iteration adds the per-iteration host cost and the LM head.
With NEO's host path (`stage_us` set, `cost/swiftllm_host.py`) one Python thread launches each
stage's kernels and then runs that stage's CPU attention, so a stage lasts
max(GPU work, stage launch + T_ca) and no separate launch floor applies.

This class is the oracle: its four functions are the cost models at the exact shape. NEO's
own table predictor (`neo/table.py`) overrides them for the decisions; the simulated-time
methods here are always called on an oracle.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simserve.cost import GpuCostModel
from simserve.cost.cpu import CpuCostModel
from simserve.models import DTYPE_BYTES, ModelSpec
from simserve.sim.cluster import Channel

_ZERO = np.zeros(1, dtype=np.int64)


@dataclass(slots=True)
class SubBatch:
    """Running sums of one (candidate) sub-batch; per-layer µs terms are cached."""

    n_pref: int = 0
    pref_tokens: int = 0
    pref_us: float = 0.0     # Σ T_pref over its prompts
    n_gdec: int = 0
    gdec_ctx: int = 0        # Σ seq_len of its GPU decodes
    n_cdec: int = 0
    cdec_ctx: int = 0        # Σ seq_len of its CPU decodes
    gdec_max: int = 0        # longest GPU decode (simulated time only; NEO's tables lack it)

    @property
    def tokens(self) -> int:
        return self.pref_tokens + self.n_gdec + self.n_cdec

    @property
    def num_reqs(self) -> int:
        return self.n_pref + self.n_gdec + self.n_cdec

    def copy(self) -> "SubBatch":
        return SubBatch(self.n_pref, self.pref_tokens, self.pref_us, self.n_gdec, self.gdec_ctx,
                        self.n_cdec, self.cdec_ctx, self.gdec_max)


class Predictor:
    def __init__(self, model: ModelSpec, gpu: GpuCostModel, cpu: CpuCostModel, h2d: Channel,
                 d2h: Channel, tp: int, lnch_us: float):
        self.model, self.gpu, self.cpu, self.tp = model, gpu, cpu, tp
        self.L = model.num_layers
        self.lnch_us = lnch_us
        self.h2d, self.d2h = h2d, d2h
        self.stage_us: float | None = None   # NEO's host path: Python launch per stage (µs)
        self.pipe_host_us = 0.0              # ... and a pipelined iteration's extra host work
        self._pref_us: dict[int, float] = {}
        self.lin_memo: dict[int, float] = {}     # `lin` by tokens, filled by `mode.decide`
        self._lm_us: dict[int, float] = {}
        self._gdec_us: dict[tuple, float] = {}
        hd = model.head_dim
        # activations of one CPU-decode row per layer and rank: q, k, v down; attention out up
        self.act_d2h_bytes = (model.num_heads + 2 * model.num_kv_heads) // tp * hd * DTYPE_BYTES
        self.act_h2d_bytes = model.num_heads // tp * hd * DTYPE_BYTES
        # one scalar CPU-attention prediction per candidate in the scan: use the grid's plain
        # Python path when the profile has one (the same function up to the last bit)
        da = cpu.ops.decode_attn
        grid = getattr(da, "grid", None) if getattr(da, "kind", "") == "grid" else None
        if grid is not None:
            # scalar(n, ctx / n) / cpu.tp, the same floats (`Grid.scalar_fn`)
            self._cdec = grid.scalar_fn(per_x=True, div=cpu.tp)
        else:
            self._cdec = lambda n, ctx: float(cpu.attention_us(n, ctx))

    # -- NEO's per-layer functions (µs) ---------------------------------------------------
    def lin(self, tokens: int) -> float:
        return self.gpu.dense_layer_us(tokens) if tokens else 0.0

    def pref(self, prompt_len: int) -> float:
        memo = self._pref_us
        v = memo.get(prompt_len)
        if v is None:   # a pure function of the length: computed once per length
            v = memo[prompt_len] = float(self.gpu.prefill_attn(np.array([prompt_len]), _ZERO))
        return v

    def gdec(self, n: int, ctx: int) -> float:
        if not n:
            return 0.0
        memo = self._gdec_us     # one decision prices the same GPU decodes several times
        v = memo.get((n, ctx))
        if v is None:
            if len(memo) > 4096:
                memo.clear()
            v = memo[n, ctx] = float(self.gpu.decode_attn(n, ctx))
        return v

    def cdec(self, n: int, ctx: int) -> float:
        return self._cdec(n, ctx) if n else 0.0

    def beyond(self) -> int:
        """Lookups past a table's last grid point (none: the oracle has no table)."""
        return 0

    def cdec_positive(self):
        """`cdec` for n >= 1 as one plain callable (the decision loop calls it per candidate);
        `cdec` itself where a subclass overrides it."""
        if type(self).cdec is Predictor.cdec and hasattr(self, "_cdec"):
            return self._cdec
        return self.cdec

    def cdec_each(self, seq_len: np.ndarray) -> np.ndarray:
        """T_cdec of each request alone (vectorised over the CPU queue)."""
        return np.asarray(self.cpu.attention_us(1, seq_len.astype(np.float64)), dtype=np.float64)

    def alone_us(self, seq_len: np.ndarray) -> np.ndarray:
        """`cdec_each(seq_len) + lnch_us` (a CPU decode alone in b1: its CPU time), read from a
        table over lengths. The table holds the same floats: every numpy operation of
        `cdec_each` is elementwise, so an element's value does not depend on the array it is
        computed in (tests check). Built on first use and grown to cover longer requests."""
        tab = getattr(self, "_alone", None)
        try:
            return tab[seq_len]
        except (IndexError, TypeError):  # first use, or a length beyond the table
            n = max(int(seq_len.max()) + 1 if len(seq_len) else 1,
                    2 * len(tab) if tab is not None else 4096)
            self._alone = self.cdec_each(np.arange(n, dtype=np.int64)) + self.lnch_us
            return self._alone[seq_len]

    def gpu_time(self, b: SubBatch) -> float:
        return self.lin(b.tokens) + b.pref_us + self.gdec(b.n_gdec, b.gdec_ctx)

    def cpu_time(self, b: SubBatch) -> float:
        return self.cdec(b.n_cdec, b.cdec_ctx) + self.lnch_us if b.n_cdec else 0.0

    def slacks(self, b0: SubBatch, b1: SubBatch) -> tuple[float, float]:
        """slack[j] = T_lin(b[1-j]) + T_pref(b[j]) + T_gdec(b[j]) − cpu_time(b[j])."""
        g0 = b0.pref_us + self.gdec(b0.n_gdec, b0.gdec_ctx)
        g1 = b1.pref_us + self.gdec(b1.n_gdec, b1.gdec_ctx)
        return (self.lin(b1.tokens) + g0 - self.cpu_time(b0),
                self.lin(b0.tokens) + g1 - self.cpu_time(b1))

    # -- simulated time -------------------------------------------------------------------
    def act_copy_us(self, n_cdec: int) -> float:
        """PCIe time of one layer's activations of `n_cdec` CPU rows (down, then back up)."""
        if not n_cdec:
            return 0.0
        return (self.d2h.duration_s(n_cdec * self.act_d2h_bytes)
                + self.h2d.duration_s(n_cdec * self.act_h2d_bytes)) * 1e6

    def pipeline_layer_us(self, b0: SubBatch, b1: SubBatch) -> float:
        """One pipelined layer (µs). Its GPU work is priced as `GpuCostModel.step_s` prices a
        GPU-only iteration's: the same dense tables, decode attention with the longest-context
        term, and the profile's in-situ factor at the iteration's tokens (on the GPU terms;
        the CPU attention is not a GPU forward). Launches: see `pipeline_s`."""
        g = self.gpu
        situ = g.in_situ(b0.tokens + b1.tokens)
        ga0 = b0.pref_us + (float(g.decode_attn(b0.n_gdec, b0.gdec_ctx, b0.gdec_max or None))
                            if b0.n_gdec else 0.0)
        ca0 = self.cdec(b0.n_cdec, b0.cdec_ctx) + self.act_copy_us(b0.n_cdec)
        ca1 = self.cdec(b1.n_cdec, b1.cdec_ctx) + self.act_copy_us(b1.n_cdec)
        py = self.stage_us
        if py is not None:      # one Python thread: the stage's launches, then its CPU attention
            ca0 += py
            ca1 += py
        return (max(situ * (self.lin(b1.tokens) + ga0), ca0)
                + max(situ * self.lin(b0.tokens), ca1))

    def head_us(self, num_seqs: int, num_tokens: int = 0) -> float:
        """Per-iteration host cost before the first layer (per token only with a host path
        that has one)."""
        g = self.gpu
        if g.per_token_us:
            return g.iter_us + g.per_seq_us * num_seqs + g.per_token_us * num_tokens
        return g.iter_us + g.per_seq_us * num_seqs

    def lm_us(self, rows: int) -> float:
        memo = self._lm_us
        v = memo.get(rows)
        if v is None:   # a pure function of the rows: computed once per count
            v = memo[rows] = float(self.gpu.ops.lm_head(rows)) if rows else 0.0
        return v

    def pipeline_s(self, b0: SubBatch, b1: SubBatch) -> tuple[float, float, float]:
        """(iteration s, head s, layer s) of the asymmetric pipeline; every request samples.

        Launch cost as `GpuCostModel.layers_us` charges an eager forward: a layer takes at
        least its kernels' launch time, here both sub-batches' kernels (2 × the profile's
        kernels per layer). Assumption (ours): a layer interleaved with CPU attention is not
        replayed from a captured CUDA graph, so no graph discount."""
        n = b0.num_reqs + b1.num_reqs
        layer = self.pipeline_layer_us(b0, b1)
        if self.stage_us is None:
            layer = float(self.gpu.layers_us(b0.tokens + b1.tokens, layer, graphs=False,
                                             launches=2.0)) / self.L
            head = self.head_us(n)
        else:
            head = self.head_us(n, b0.tokens + b1.tokens) + self.pipe_host_us
        lm = self.lm_us(n) * self.gpu.in_situ(b0.tokens + b1.tokens)
        return (head + self.L * layer + lm) * 1e-6, head * 1e-6, layer * 1e-6
