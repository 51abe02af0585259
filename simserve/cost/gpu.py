"""Cost model: the time of one batch (one engine iteration) on a GPU under TP degree t.

    t_iter = host(T, S_seq)
           + L · [ dense(T) + Σ_chunks prefill_attn(chunk, ctx) + decode_attn(B, ΣC)
                   + 2 · allreduce(T) ]
           + lm_head(R)

T tokens in the batch, prefill chunks of `chunk` new tokens after `ctx` cached ones,
B decodes with total context ΣC, R rows that sample (decodes + chunks that end a prompt).
`mixed_attention="varlen"` prices decodes that share one variable-length attention call
with prefill chunks (the profile's `varlen_decode` table) instead of their own kernel.
The forward pass is multiplied by the profile's in-situ factor of T (`overheads.in_situ`,
fitted by `simserve validate fit` to whole forwards the real executor timed; 1 without one).
Host cost: per-iteration + per-sequence overhead, and either a CUDA-graph replay (T at or below
the profile's `graph_max_tokens` when graphs are on; kernels then run back to back, hiding
`graph_overlap_us_per_kernel` of each separately timed kernel) or eager launches, which overlap the GPU
work layer by layer: a layer takes max(GPU time, kernels × launch time).

Every function is a precomputed table indexed by token count (Python floats), so one
prediction costs a few microseconds. `decode_only_s` accepts an array of context sums and
returns the same floats the scalar path would: event leaping relies on that.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simserve.hardware.attention import decode_steps_us
from simserve.hardware.functions import _interp
from simserve.hardware.profile import HardwareProfile, link_curve
from simserve.models import DTYPE_BYTES, ModelSpec


@dataclass(slots=True)
class BatchShape:
    """What a scheduler hands the cost model for one iteration (the per-request fields are
    int arrays or lists of ints: a small batch's lists save numpy conversions). Read-only by
    convention: not frozen, because a frozen dataclass's __init__ sets each field through
    object.__setattr__, which costs several times the loop that classifies the batch's
    requests."""

    num_tokens: int = 0
    prefill_chunks: np.ndarray = field(default_factory=lambda: _EMPTY)  # new tokens per chunk
    prefill_ctx: np.ndarray = field(default_factory=lambda: _EMPTY)     # cached tokens before it
    num_decodes: int = 0
    decode_ctx_sum: int = 0        # Σ context of the decodes (tokens already in KV)
    num_sample_rows: int = 0
    # each decode's attention length (context + the new token); optional, for executors that
    # need the per-request lengths (the cost model uses decode_ctx_sum only)
    decode_ctx: np.ndarray | None = None
    decode_ctx_max: int | None = None  # max(decode_ctx), when the caller has it at hand

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_chunks)


_EMPTY: np.ndarray = np.zeros(0, dtype=np.int64)


def prefill_batch(prompt_tokens: int, ctx: int = 0) -> BatchShape:
    """One chunk of `prompt_tokens` after `ctx` cached tokens, alone, sampling one token."""
    return BatchShape(num_tokens=prompt_tokens, prefill_chunks=np.array([prompt_tokens]),
                      prefill_ctx=np.array([ctx]), num_sample_rows=1)


def in_situ_factor(m: dict | None, tokens: np.ndarray) -> np.ndarray:
    """The profile's in-situ factor at each token count (1 without one): whole forward passes
    measured by the real executor over the sum of separately timed kernels, a piecewise-linear
    function of log2(tokens) through `tokens`/`factor` knots, flat beyond them."""
    if not m:
        return np.ones(len(tokens))
    lx = np.log2(np.maximum(np.asarray(tokens, dtype=np.float64), 1.0))
    return np.interp(lx, np.log2(np.asarray(m["tokens"], dtype=np.float64)),
                     np.asarray(m["factor"], dtype=np.float64))


def _compiled() -> bool:
    """Does this module run compiled (simserve/compiled.py)? Compiled functions have no
    `__code__`."""
    return not hasattr(_compiled, "__code__")


# Up to this many steps `decode_steps_list` beats `decode_steps_s`'s dozen numpy calls. From
# source its per-step Python loop crosses over at about 24 steps; compiled, the loop runs on
# C doubles and the list path was faster at every length measured (1 to 320 steps), so it
# always takes it.
LIST_STEPS = 1 << 30 if _compiled() else 24
# up to this many steps, `decode_only_s` per step beats `decode_steps_list`'s fixed numpy
# calls: most leaps of an engine under async scheduling that waits to see its head take one
SCALAR_STEPS = 2


class GpuCostModel:
    list_steps = LIST_STEPS  # see LIST_STEPS
    def __init__(self, model: ModelSpec, gpu: HardwareProfile, tp: int = 1,
                 nvlink: HardwareProfile | None = None, cuda_graphs: bool = True,
                 table_tokens: int = 16384, mixed_attention: str = "split",
                 graph_max_tokens: int | None = None, host=None):
        model.check_tp(tp)
        if tp > 1 and nvlink is None:
            raise ValueError("TP > 1 needs an NVLink (or other GPU-GPU) link profile")
        self.model, self.gpu, self.tp = model, gpu, tp
        self.num_layers = model.num_layers
        self.ops = gpu.ops(model.name, tp)
        oh = gpu.overheads
        # the host path: a measured engine's (`cost/host.py`), or the profile's generic
        # per-iteration overheads added to the forward when no engine is given
        self.host = host
        self.overlap = bool(host is not None and host.async_scheduling)
        if host is not None:
            self.iter_us, self.per_seq_us = host.step_us, host.step_per_seq_us
            self.per_token_us = host.step_per_token_us
        else:
            self.iter_us = float(oh.get("iteration_us", 0.0))
            self.per_seq_us = float(oh.get("per_seq_us", 0.0))
            self.per_token_us = 0.0
        self.launch_layer_us = float(oh.get("launch_us_per_kernel", 0.0)) * float(
            oh.get("kernels_per_layer", 0))
        self.graph_us = float(oh.get("graph_replay_us", 0.0))
        gmax = oh.get("graph_max_tokens", 0) if graph_max_tokens is None else graph_max_tokens
        self.graph_max = int(gmax) if cuda_graphs else 0
        # kernels replayed back to back in a graph hide part of the latency that separately
        # timed kernels include (fitted from whole graph-replayed decode steps)
        self.graph_overlap_layer_us = float(oh.get("graph_overlap_us_per_kernel", 0.0)) * float(
            oh.get("kernels_per_layer", 0))
        self._decode_fn = self.ops.decode_attn
        self.prefill_attn = self.ops.prefill_attn.us
        att = (host.attention or {}).get(model.name) if host is not None and tp == 1 else None
        if att:  # the engine's own attention kernels, timed (vLLM's FA3: one varlen call)
            from simserve.hardware.attention import decode_fn, prefill_fn
            self.prefill_attn = prefill_fn(f"{host.name} prefill_attn",
                                           dict(att["prefill_attn"])).us
            self._decode_fn = decode_fn(f"{host.name} decode_attn", dict(att["decode_attn"]))
            mixed_attention = "varlen" if "varlen_decode" in att else mixed_attention
        self.decode_attn = self._decode_fn.us
        if mixed_attention not in ("split", "varlen"):
            raise ValueError(f"mixed_attention: expected 'split' or 'varlen', got {mixed_attention!r}")
        vl = self.ops.varlen_decode
        if att and "varlen_decode" in att:
            from simserve.hardware.functions import Affine
            vl = Affine.from_mapping(f"{host.name} varlen_decode", dict(att["varlen_decode"]))
        self.varlen = None
        if mixed_attention == "varlen":
            if vl is None:
                raise ValueError(f"mixed_attention 'varlen': profile {gpu.name} has no "
                                 f"varlen_decode table for {model.name} at TP{tp}")
            self.varlen = (vl.const_us, vl.coef("per_context_token"))
        self._ar = self._allreduce_fn(nvlink)
        self._build_tables(table_tokens)
        self._decode_rows: dict = {}  # B -> `_decode_row(B)`

    # -- tables -------------------------------------------------------------------------
    def _allreduce_fn(self, nvlink):
        if self.tp == 1:
            return None
        table = link_curve(nvlink, f"allreduce_ranks{self.tp}")
        if table is not None:  # measured at this rank count: use the table
            return table
        ln = nvlink.link
        lat = float(ln.get("collective_latency_us", ln.get("latency_us", 0.0)))
        busbw = float(ln["allreduce_busbw_gbps"]) * 1e9
        scale = 2.0 * (self.tp - 1) / self.tp * self.model.hidden * DTYPE_BYTES / busbw * 1e6
        return lat, scale

    def allreduce_us(self, tokens):
        """One all-reduce of `tokens` hidden vectors across the TP group (µs)."""
        if self._ar is None:
            return 0.0 * np.asarray(tokens, dtype=np.float64)
        if callable(self._ar):
            return self._ar(np.asarray(tokens, dtype=np.float64) * self.model.hidden * DTYPE_BYTES)
        lat, scale = self._ar
        return lat + scale * np.asarray(tokens, dtype=np.float64)

    def _build_tables(self, n: int) -> None:
        t = np.arange(n + 1, dtype=np.float64)
        dense = sum(c(t) for c in self.ops.dense.values()) + 2.0 * self.allreduce_us(t)
        dense[0] = 0.0
        sizes = [c for c in (self.host.capture_sizes if self.host is not None else ())
                 if c <= self.graph_max]
        if sizes:  # a CUDA-graph replay runs the batch padded to the next captured size
            caps = np.asarray(sizes, dtype=np.float64)
            at_caps = sum(c(caps) for c in self.ops.dense.values()) + 2.0 * self.allreduce_us(caps)
            k = np.arange(1, min(n, int(caps[-1])) + 1)
            dense[k] = at_caps[np.searchsorted(caps, k)]
        lm = np.asarray(self.ops.lm_head(t))
        lm[0] = 0.0
        self._dense = dense.tolist()     # per layer, µs, indexed by tokens (incl. all-reduces)
        self._lm = lm.tolist()           # µs, indexed by sampled rows
        situ = in_situ_factor(self.gpu.overheads.get("in_situ"), t)
        if self.host is not None and self.host.gpu_tokens:  # the engine's own kernels
            situ = situ * self.host.gpu_factor_at(t)
        self._situ = situ.tolist()
        self._n = n

    def _decode_row(self, B: int) -> tuple:
        """(dense layer µs, LM head µs, in-situ factor, host work µs, CUDA graph?) of a step
        decoding B sequences, from the tables (cached: they only ever grow)."""
        row = self._decode_rows.get(B)
        if row is None:
            self._ensure(B)
            row = self._decode_rows[B] = (self._dense[B], self._lm[B], self._situ[B],
                                          self._host_us(B, B), B <= self.graph_max)
        return row

    def _ensure(self, tokens: int) -> None:
        if tokens > self._n:
            self._build_tables(max(tokens, 2 * self._n))

    def dense_layer_us(self, tokens: int) -> float:
        self._ensure(tokens)
        return self._dense[tokens]

    # -- predictions --------------------------------------------------------------------
    def layers_us(self, tokens: int, gpu_layer_us, graphs: bool = True, launches: float = 1.0):
        """All layers (µs) from one layer's summed kernel times under the launch model: a CUDA
        graph replay, whose back-to-back kernels hide `graph_overlap_us_per_kernel` each, or
        eager launches overlapping the GPU work layer by layer. Arrays allowed. `graphs=False`
        forces the eager path; `launches` scales the kernels launched per layer (NEO's pipeline
        launches two sub-batches' kernels per layer)."""
        L = self.num_layers
        if type(gpu_layer_us) is float:  # one step: plain floats, the same IEEE operations
            if graphs and tokens <= self.graph_max:
                a, b = gpu_layer_us - self.graph_overlap_layer_us, 0.5 * gpu_layer_us
                return self.graph_us + L * (a if a >= b else b)
            a = launches * self.launch_layer_us
            return L * (gpu_layer_us if gpu_layer_us >= a else a)
        if graphs and tokens <= self.graph_max:
            layer = np.maximum(gpu_layer_us - self.graph_overlap_layer_us, 0.5 * gpu_layer_us)
            return self.graph_us + L * layer
        return L * np.maximum(gpu_layer_us, launches * self.launch_layer_us)

    def in_situ(self, tokens: int) -> float:
        """The profile's in-situ factor at `tokens` batch tokens (1 without one)."""
        self._ensure(tokens)
        return self._situ[tokens]

    def forward_us(self, tokens: int, gpu_layer_us, sample_rows: int):
        """The forward pass (µs): `layers_us`, the LM head over `sample_rows`, times the in-situ
        factor of `tokens`. `gpu_layer_us` may be an array (identical floats per element)."""
        return (self.layers_us(tokens, gpu_layer_us) + self._lm[sample_rows]) * self._situ[tokens]

    def step_s(self, b: BatchShape) -> float:
        """Duration of one iteration in seconds: its host work and its forward combined (the
        async engine-core loop's host calls, where measured, are the vLLM-family runtime's:
        `policies/vllm_loop.py`)."""
        base = self._host_us(b.num_prefills + b.num_decodes, b.num_tokens)
        return float(self._combine(base, self._forward_step_us(b))) * 1e-6

    def _forward_step_us(self, b: BatchShape):
        cmax = b.decode_ctx_max
        if cmax is None and b.decode_ctx is not None and len(b.decode_ctx):
            cmax = int(max(b.decode_ctx))
        if b.num_prefills == 0:
            return self._decode_forward_us(b.num_decodes, b.decode_ctx_sum, cmax)
        self._ensure(max(b.num_tokens, b.num_sample_rows))
        layer = self._dense[b.num_tokens] + self.prefill_attn(b.prefill_chunks, b.prefill_ctx)
        if b.num_decodes:
            if self.varlen is None:  # decodes get their own decode-attention kernel
                layer += self.decode_attn(b.num_decodes, b.decode_ctx_sum, cmax)
            else:                    # one variable-length call over prefill chunks and decodes
                layer += self.varlen[0] + self.varlen[1] * b.decode_ctx_sum
        return self.forward_us(b.num_tokens, layer, b.num_sample_rows)

    def decode_only_s(self, num_decodes: int, ctx_sum, ctx_max=None):
        """Decode-only iteration(s): scalar or array of context sums (and of longest contexts,
        when given: unequal contexts cost more in a split-K kernel), identical floats."""
        B = num_decodes
        if B == 0:
            return 0.0 * ctx_sum
        base = self._host_us(B, B)
        return self._combine(base, self._decode_forward_us(B, ctx_sum, ctx_max)) * 1e-6

    def _decode_forward_us(self, B: int, ctx_sum, ctx_max=None):
        if B == 0:
            return 0.0 * ctx_sum
        self._ensure(B)
        layer = self._dense[B] + self.decode_attn(B, ctx_sum, ctx_max)
        return self.forward_us(B, layer, B)

    def _host_us(self, num_seqs, num_tokens):
        """Host work of one step (µs): per step, per sequence and per token scheduled."""
        return self.iter_us + self.per_seq_us * num_seqs + self.per_token_us * num_tokens

    def _combine(self, host_us, forward_us):
        """One step from its host work and its forward (µs; arrays allowed): overlapped under
        asynchronous scheduling (the host prepares the next step while the GPU runs this
        one), added otherwise."""
        if self.overlap:
            if type(forward_us) is float:  # one step: np.maximum's result as a plain float
                return forward_us if forward_us >= host_us else float(np.maximum(host_us, forward_us))
            return np.maximum(host_us, forward_us)
        return host_us + forward_us

    def decode_steps(self, num_decodes: int, ctx_sum0: int, ctx_max0: int, k: int
                     ) -> list[float]:
        """Durations (s) of k consecutive decode steps of B = num_decodes sequences:
        `decode_only_s(B, ctx_sum0 + B·j, ctx_max0 + j)` for j < k, the same floats. The one
        function callers use; it picks the cheapest form, all the same arithmetic: one step
        at a time (as stepping prices it) up to `SCALAR_STEPS`, the plain-float loop
        (`decode_steps_list`) up to `list_steps`, numpy (`decode_steps_s`) above. The
        per-step `decode_only_s` is the reference the others are tested against."""
        if k <= SCALAR_STEPS:
            B = num_decodes
            return [self.decode_only_s(B, ctx_sum0 + B * j, ctx_max0 + j) for j in range(k)]
        if k <= self.list_steps:
            return self.decode_steps_list(num_decodes, ctx_sum0, ctx_max0, k)
        return self.decode_steps_s(num_decodes, ctx_sum0, ctx_max0, k).tolist()

    def decode_steps_array(self, num_decodes: int, ctx_sum0: int, ctx_max0: int, k: int
                           ) -> np.ndarray:
        """`decode_steps` as a float64 array (numpy's own result above `list_steps`)."""
        if k > self.list_steps:
            return self.decode_steps_s(num_decodes, ctx_sum0, ctx_max0, k)
        return np.array(self.decode_steps(num_decodes, ctx_sum0, ctx_max0, k), dtype=np.float64)

    def decode_steps_s(self, num_decodes: int, ctx_sum0: int, ctx_max0: int, k: int):
        """`decode_only_s(B, ctx_sum0 + B·j, ctx_max0 + j)` for j < k (k consecutive decode
        steps of B sequences): the same floats, computed with fewer numpy calls."""
        B = num_decodes
        self._ensure(B)
        layer = decode_steps_us(self._decode_fn, B, ctx_sum0, ctx_max0, k)
        layer += self._dense[B]
        t = self.forward_steps_us(B, layer)
        if self.overlap:   # the same combination as `_combine`
            np.maximum(t, self._host_us(B, B), out=t)
        else:
            t += self._host_us(B, B)
        t *= 1e-6
        return t

    def forward_steps_us(self, batch: int, layer: np.ndarray) -> np.ndarray:
        """`forward_us(batch, layer, batch)` for an array of per-layer times (µs), with fewer
        numpy calls (`layer` is overwritten): the same operations in the same order."""
        self._ensure(batch)
        if batch <= self.graph_max:
            t = layer - self.graph_overlap_layer_us
            layer *= 0.5
            np.maximum(t, layer, out=t)
            t *= self.num_layers
            t += self.graph_us
        else:
            t = np.maximum(layer, self.launch_layer_us, out=layer)
            t *= self.num_layers
        t += self._lm[batch]
        t *= self._situ[batch]
        return t

    def decode_steps_list(self, num_decodes: int, ctx_sum0: int, ctx_max0: int, k: int
                          ) -> list[float]:
        """`decode_steps_s(...)` as a list: numpy's log2, interp and exp on the grid (the
        calls whose floats numpy defines), then the rest of each step's arithmetic in one
        loop over plain floats (`_decode_step_times`, C doubles when compiled) instead of a
        dozen numpy calls, which cost more than the arithmetic on short arrays. The same
        floats (tests check)."""
        B = num_decodes
        fn = self._decode_fn
        grid = getattr(fn, "grid", None)
        if grid is None:
            return self.decode_steps_s(B, ctx_sum0, ctx_max0, k).tolist()
        lt0, lt1, a, w, xbeyond, ys0, ys1 = grid.row_plan(B)
        y_first, y_last = ctx_sum0 / B, (ctx_sum0 + B * (k - 1)) / B
        if xbeyond or y_first < ys0 or y_first < 1.0 or y_last > ys1:
            return self.decode_steps_s(B, ctx_sum0, ctx_max0, k).tolist()
        lya = _mean_contexts(ctx_sum0, B, k)
        np.log2(lya, out=lya)
        base = _interp(lya, grid._ly, lt0)
        if a is not None:  # between two rows: a·row0 + w·row1, as `Grid.rising`
            _blend(base, a, _interp(lya, grid._ly, lt1), w)
        np.exp(base, out=base)
        imb = fn.imbalance
        e0 = -(-ctx_sum0 // B)
        if imb is not None and ctx_max0 > e0:  # unequal contexts (constant over the steps)
            runs, rate = imb.run_table(B, ctx_max0 + k), imb.rate  # (e0 < ctx_max0)
        else:
            runs, rate = None, 0.0
        dense, lm, situ, host, graph = self._decode_row(B)
        return _decode_step_times(
            base, runs, ctx_max0, e0, rate, dense, self.num_layers, lm, situ, host, graph,
            self.overlap, self.graph_us, self.graph_overlap_layer_us, self.launch_layer_us)

    def scheduler_s(self, num_seqs: int) -> float:
        """The host's per-iteration scheduling cost inside `step_s` (profile overheads
        `iteration_us` + `per_seq_us` per sequence); the rest of `step_s` is the forward pass."""
        return (self.iter_us + self.per_seq_us * num_seqs) * 1e-6

    def forward_s(self, b: BatchShape) -> float:
        """The forward pass alone (what a real executor times), without host work."""
        return float(self._forward_step_us(b)) * 1e-6

    def prefill_only_s(self, prompt_tokens: int) -> float:
        """One whole prompt alone in a batch (it samples its first token)."""
        return self.step_s(prefill_batch(prompt_tokens))


def _decode_step_times(base: np.ndarray, runs: np.ndarray | None, m0: int, e0: int,
                       rate: float, dense: float, L: int, lm: float, situ: float, host: float,
                       graph: bool, overlap: bool, g: float, ov: float, la: float
                       ) -> list[float]:
    """`decode_steps_list`'s arithmetic per step j, in seconds, from its attention time on
    the grid (`base[j]`, µs) and, for unequal contexts, the longest split-K program at the
    longest context and at equal ones (`runs[m0 + j]`, `runs[e0 + j]`: `SplitImbalance.
    run_table`; None: equal contexts, factor 1): the unequal-context factor
    (`SplitImbalance.factor`), the dense layers, the forward pass (`forward_us`: CUDA graph
    or eager launches) and its combination with the host work (`_combine`). Plain floats,
    the same operations in the same order; C doubles when compiled (`gpu.pxd`)."""
    out = []
    for j in range(len(base)):
        b = float(base[j])
        if runs is not None:
            scale = 1.0 / (rate * (b if b >= 1e-9 else 1e-9))
            x = float(runs[m0 + j]) * scale
            xe = float(runs[e0 + j]) * scale
            v = b * (math.sqrt(1.0 + x * x) / math.sqrt(1.0 + xe * xe)) + dense
        else:
            v = b + dense
        if graph:
            f = ((g + L * (v - ov if v - ov >= 0.5 * v else 0.5 * v)) + lm) * situ
        else:
            f = (L * (v if v >= la else la) + lm) * situ
        if overlap:
            out.append((f if f >= host else host) * 1e-6)
        else:
            out.append((host + f) * 1e-6)
    return out


def _mean_contexts(ctx_sum0: int, B: int, k: int) -> np.ndarray:
    """(ctx_sum0 + B·j) / B for j < k, as Python divides two ints (each converted exactly,
    then one division): the mean context of k consecutive decode steps."""
    y = np.empty(k)
    yv = memoryview(y)
    for j in range(k):
        yv[j] = (ctx_sum0 + B * j) / B
    return y


def _blend(r0: np.ndarray, a: float, r1: np.ndarray, w: float) -> None:
    """r0 := a·r0 + w·r1 elementwise (numpy's three calls' floats, in one loop)."""
    for j in range(len(r0)):
        r0[j] = a * float(r0[j]) + w * float(r1[j])
