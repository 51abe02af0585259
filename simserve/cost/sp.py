"""Cost of one Conflux Parallelism iteration on R logical ranks, each a TP group of t GPUs
(ConfluxServe §4, §6.2, App. A, C).

Per layer, two regions separated by synchronisation points (Fig. 11):

    shared linear   = max_r dense_t(n_p^r + n_d^r)            every rank co-batches its prefill
                                                              shard and its local decodes
                                                              (dense_t includes the TP all-reduces)
    split attention = max(β·T_P, α·T_D), at most T_P + T_D    the two paths run concurrently
    T_D = max_r decode_attn_t(n_d^r, Σ_{i on r} c_i)          rank-local decode attention
    T_P = a2a(max_r n_p^r · qkv bytes) + prefill_attn_{t·R}(chunks) + a2a(max_r n_p^r · out bytes)

Ulysses SP turns the sequence-sharded QKV into head shards with one all-to-all, runs causal
attention for *all* chunk tokens on nh/(t·R) query heads per GPU (the profile's TP-(t·R) head
layout, so its prefill table is used as is), and returns outputs with a second all-to-all. The
split region is capped at the serialised sum: overlap never makes it slower than running the
two paths back to back. The host cost, CUDA-graph replay (piecewise graphs around the linear
ops) and the LM head come from the base `GpuCostModel`, evaluated on the busiest rank.

All-to-all time: the link profile's measured table at 2 ranks (bytes = input per rank); other
rank counts use the profile's fitted all-to-all latency + (R−1)/R · bytes / bus bandwidth
(nccl-tests' bus-bandwidth convention, as the measurement recorded it).

Contention α, β default to the GPU profile's `overheads.sp_contention`: measured on the H200
(α 1.0, β 1.72, fitted to real two-GPU Conflux Parallelism iterations, validation/), derived
for other GPUs by `hardware/rescale.py` (decode attention's SM share scaled by bandwidth per
SM). `PAPER_CONTENTION` is the paper's Fig. 14a value, a what-if and the stand-in for profiles
without one: at 32 decodes/GPU the overlapped attention region took 28.0 ms against 36.5 ms
serialised, closing 58 % of the gap to the contention-free bound, so that bound is
36.5 − 8.5/0.58 = 21.8 ms and overlapped/ideal = 28.0/21.8 ≈ 1.28.
"""
from __future__ import annotations

import numpy as np

from simserve.cost.gpu import GpuCostModel
from simserve.hardware.attention import decode_steps_us
from simserve.hardware.profile import HardwareProfile, link_curve
from simserve.models import DTYPE_BYTES, ModelSpec

PAPER_CONTENTION = 1.28  # α = β from Fig. 14a (see the module docstring)
# decode steps of one rank priced per cost-model call: a ConfluxServe rank's decode set lives
# ~50 steps (median); 128 took 1-2 % fewer instructions than 256 on conflux-mooncake and -fig12
DECODE_LOOKAHEAD = 128


def profile_contention(gpu: HardwareProfile) -> tuple[float, float]:
    """(α, β) of the GPU profile's `overheads.sp_contention`, else the paper's Fig. 14a value."""
    c = gpu.overheads.get("sp_contention") or {}
    return (float(c.get("alpha", PAPER_CONTENTION)), float(c.get("beta", PAPER_CONTENTION)))


class SpCostModel:
    """Iteration time of R logical ranks (TP t each) running Conflux Parallelism."""

    def __init__(self, model: ModelSpec, gpu: HardwareProfile, nvlink: HardwareProfile | None,
                 ranks: int, tp: int = 1, alpha: float | None = None,
                 beta: float | None = None, cuda_graphs: bool = True,
                 table_tokens: int = 16384, overlap: bool = True):
        if ranks < 1:
            raise ValueError(f"ranks: expected a positive integer, got {ranks!r}")
        alpha, beta = (profile_contention(gpu)[i] if v is None else v
                       for i, v in enumerate((alpha, beta)))
        if alpha < 1 or beta < 1:
            raise ValueError(f"alpha, beta: contention factors must be >= 1, got {alpha}, {beta}")
        if ranks > 1 and nvlink is None:
            raise ValueError("sequence parallelism over ranks needs an NVLink link profile")
        model.check_tp(tp * ranks)  # heads must split over every GPU of the SP group
        self.model, self.R, self.tp = model, ranks, tp
        self.alpha, self.beta = float(alpha), float(beta)
        self.overlap = bool(overlap)  # False: prefill and decode attention run back to back
        self.base = GpuCostModel(model, gpu, tp, nvlink, cuda_graphs, table_tokens=table_tokens)
        self.num_layers = model.num_layers
        self.sp_prefill_attn = gpu.ops(model.name, tp * ranks).prefill_attn.us
        nh, nkv = model.heads_per_rank(tp)
        self.qkv_bytes_per_token = (nh + 2 * nkv) * model.head_dim * DTYPE_BYTES
        self.out_bytes_per_token = nh * model.head_dim * DTYPE_BYTES
        self._a2a = self._alltoall_fn(nvlink) if ranks > 1 and nvlink is not None else None
        # KV bytes of one token on one GPU of a logical rank (all layers)
        self.kv_bytes_per_token_gpu = model.kv_bytes_per_token_per_rank(tp)
        # (rank, decodes, Σ context − decodes·longest) -> (longest, µs from that longest on)
        self._lines: dict = {}
        self._comm: dict = {}         # largest prefill shard (tokens) -> both all-to-alls, µs

    def _alltoall_fn(self, nvlink: HardwareProfile):
        table = link_curve(nvlink, f"alltoall_ranks{self.R}")
        if table is not None:
            return table
        ln = nvlink.link
        lat = float(ln.get("alltoall_latency_us", ln.get("collective_latency_us", 0.0)))
        busbw = float(ln["alltoall_busbw_gbps"]) * 1e9
        frac = (self.R - 1) / self.R

        def alltoall(nbytes):
            if type(nbytes) is int:   # one size: the same IEEE operations on a Python float
                return lat + frac * float(nbytes) / busbw * 1e6
            return lat + frac * np.asarray(nbytes, dtype=np.float64) / busbw * 1e6
        return alltoall

    # -- per-layer pieces (µs) --------------------------------------------------------------
    def alltoall_us(self, nbytes: float) -> float:
        """One all-to-all with `nbytes` of input on the busiest GPU (µs); 0 on one rank."""
        if self._a2a is None or nbytes <= 0:
            return 0.0
        return float(self._a2a(nbytes))

    def comm_us(self, max_shard_tokens: int) -> float:
        """Both Ulysses all-to-alls of a layer, sized by the largest prefill shard."""
        v = self._comm.get(max_shard_tokens)
        if v is None:
            if len(self._comm) > 1 << 16:
                self._comm.clear()
            v = self._comm[max_shard_tokens] = (
                self.alltoall_us(max_shard_tokens * self.qkv_bytes_per_token)
                + self.alltoall_us(max_shard_tokens * self.out_bytes_per_token))
        return v

    def prefill_path_us(self, max_shard_tokens: int, chunks, ctxs) -> float:
        """T_P: all-to-all, head-sharded causal attention over every chunk (arrays or lists of
        their new and cached tokens), all-to-all."""
        return self.comm_us(max_shard_tokens) + float(self.sp_prefill_attn(chunks, ctxs))

    def decode_path_us(self, n_d, dctx, dmax=None) -> float | None:
        """T_D: the heaviest rank's local decode attention (None: no decodes anywhere); `dmax`,
        each rank's longest context, prices unequal contexts (GpuCostModel.decode_attn)."""
        if dmax is None:
            t = [float(self.base.decode_attn(int(b), int(c), None))
                 for b, c in zip(n_d, dctx) if b > 0]
        else:
            t = [self.rank_attn1(r, int(b), int(c), int(m))
                 for r, (b, c, m) in enumerate(zip(n_d, dctx, dmax)) if b > 0]
        return max(t) if t else None

    def _decode_attn(self, r: int, b: int, c: int, m: int | None) -> float:
        """`GpuCostModel.decode_attn(b, c, m)` of rank r, as a Python float."""
        if m is None:
            return float(self.base.decode_attn(b, c, None))
        return self.rank_attn1(r, b, c, m)

    def _profile_fn(self):
        """The profile's decode-attention function when the base model prices decode attention
        with it (None when something else, e.g. a hook, took its place)."""
        fn = self.base._decode_fn
        return fn if getattr(self.base.decode_attn, "__self__", None) is fn else None

    def rank_attn1(self, r: int, b: int, c: int, m: int) -> float:
        """`rank_attn(r, b, c, m, 1)[0]` as a Python float: read from the rank's cached line
        when it holds step m, else priced alone. A stepped iteration asks for one step of a
        decode set that often changes before the next (about half the lines a ConfluxServe run
        would build serve one step), so a miss builds no line; the profile's scalar path gives
        the line's floats (`decode_steps_us`: the same operations on the same values;
        tests/test_conflux_search.py checks lines against it)."""
        e = self._lines.get((r, b, c - b * m))
        if e is not None:
            i = m - e[0]
            if 0 <= i < len(e[1]):
                return float(e[1][i])
        fn = self._profile_fn()
        if fn is None:
            return float(self.rank_attn(r, b, c, m, 1)[0])
        return float(fn.us(b, c, m))

    def rank_attn(self, r: int, b: int, c: int, m: int, n: int) -> np.ndarray:
        """Decode attention (µs) of rank r's b decodes over n steps from Σ context c and
        longest m: each step adds b and 1. Steps on one such line are priced in runs of at
        least DECODE_LOOKAHEAD and kept (the array path gives the scalar path's floats)."""
        key = (r, b, c - b * m)
        e = self._lines.get(key)
        if e is not None and e[0] <= m:
            m0, vals = e
            i = m - m0
            if i + n > len(vals):            # extend the line (elementwise: same floats)
                if i > 4 * DECODE_LOOKAHEAD:  # drop what is behind
                    m0, vals, i = m, vals[i:], 0
                lo = m0 + len(vals)
                hi = m0 + max(i + n, 2 * len(vals))
                vals = np.concatenate((vals, self._attn(b, c + b * (lo - m), lo, hi - lo)))
                self._lines[key] = (m0, vals)
            return vals[i:i + n]
        if len(self._lines) > 4096:
            self._lines.clear()
        vals = self._attn(b, c, m, max(n, DECODE_LOOKAHEAD))
        self._lines[key] = (m, vals)
        return vals[:n]

    def _attn(self, b: int, c: int, m: int, k: int) -> np.ndarray:
        """Decode attention (µs) of b decodes at k consecutive steps from Σ context c and
        longest m (each step adds b and 1): `decode_steps_us` on the profile's function (a
        third of the general path's numpy calls, the same floats: tests/test_conflux_speed.py),
        the general array call when something else prices decode attention."""
        fn = self._profile_fn()
        if fn is not None:
            return np.asarray(decode_steps_us(fn, b, c, m, k), dtype=np.float64)
        j = np.arange(m, m + k, dtype=np.int64)
        return self._attn_general(b, c + b * (j - m), j)

    def _attn_general(self, b: int, ctx_sum: np.ndarray, ctx_max: np.ndarray) -> np.ndarray:
        return np.asarray(self.base.decode_attn(b, ctx_sum, ctx_max), dtype=np.float64)

    def split_attention_us(self, t_p: float | None, t_d: float | None) -> float:
        if t_p is None:
            return 0.0 if t_d is None else t_d
        if t_d is None:
            return t_p
        if not self.overlap:
            return t_p + t_d
        return min(max(self.beta * t_p, self.alpha * t_d), t_p + t_d)

    # -- whole iterations (s) ----------------------------------------------------------------
    def iteration_s(self, n_p, n_d, dctx, chunks: np.ndarray, ctxs: np.ndarray,
                    num_sample_rows: int, dmax=None) -> float:
        """One iteration. n_p / n_d / dctx: prefill tokens, decodes and Σ decode context
        (tokens already in KV plus the new one) per rank; chunks / ctxs: every prefill chunk's new
        and cached tokens (Σ chunks = Σ n_p); num_sample_rows: rows the LM head samples on the
        busiest rank; dmax: each rank's longest decode context (optional)."""
        if not any(n_p):
            if dmax is not None and self._profile_fn() is not None:
                return self.decode_step_s(n_d, dctx, dmax)   # the same floats, fewer calls
            dm = None if dmax is None else np.asarray(dmax)[None, :]
            return float(self.decode_only_s(n_d, np.asarray(dctx)[None, :], dm)[0])
        tokens = [int(p) + int(d) for p, d in zip(n_p, n_d)]
        b = self.base
        busiest = max(tokens)
        b._ensure(max(busiest, num_sample_rows))
        dense = b._dense
        t_lin = max(dense[x] for x in tokens)   # dense_layer_us of each rank
        t_p = self.prefill_path_us(int(max(n_p)), chunks, ctxs)   # arrays or lists
        layer = t_lin + self.split_attention_us(t_p, self.decode_path_us(n_d, dctx, dmax))
        return (self.host_us(n_d, len(chunks)) + b.forward_us(busiest, layer, num_sample_rows)) * 1e-6

    def mixed_step_s(self, n_p: list[int], n_d: list[int], dctx: list[int], chunks: list[int],
                     ctxs: list[int], num_sample_rows: int, dmax: list[int]) -> float:
        """`iteration_s(n_p, n_d, dctx, chunks, ctxs, num_sample_rows, dmax)` of an iteration
        that prefills (some n_p > 0), every argument a Python int or a list of them: the same
        operations on the same values, without the general entry's conversions."""
        b = self.base
        tokens = [p + d for p, d in zip(n_p, n_d)]
        busiest = max(tokens)
        b._ensure(busiest if busiest >= num_sample_rows else num_sample_rows)
        dense = b._dense
        t_lin = max([dense[x] for x in tokens])   # dense_layer_us of each rank
        t_p = self.prefill_path_us(max(n_p), chunks, ctxs)
        t_d = None   # `decode_path_us` on ints: the first largest rank's decode attention
        attn1 = self.rank_attn1
        for r, k in enumerate(n_d):
            if k > 0:
                v = attn1(r, k, dctx[r], dmax[r])
                if t_d is None or v > t_d:
                    t_d = v
        layer = t_lin + self.split_attention_us(t_p, t_d)
        return (self.host_us(n_d, len(chunks)) + b.forward_us(busiest, layer, num_sample_rows)) \
            * 1e-6

    def host_us(self, n_d, num_chunks: int) -> float:
        """The iteration's host scheduling cost (the base model's), for the busiest rank's
        sequences: its decodes plus every prefill chunk."""
        return self.base.iter_us + self.base.per_seq_us * (int(max(n_d)) + num_chunks)

    def decode_only_s(self, n_d, dctx, dmax=None):
        """Decode-only iterations, vectorised: n_d (R,) decodes per rank, dctx (k, R) Σ context
        per rank at each of k consecutive steps. Returns (k,) seconds. Stepping one by one and
        leaping call this same function, so their floats are identical."""
        n_d = np.asarray(n_d, dtype=np.int64)
        dctx = np.asarray(dctx)
        k = dctx.shape[0]
        if n_d.sum() == 0:
            return np.zeros(k)
        busy = int(n_d.max())
        b = self.base
        b._ensure(busy)
        t_lin = max(b.dense_layer_us(int(x)) for x in n_d)
        dmax = None if dmax is None else np.asarray(dmax)
        t_d = np.max(np.stack([np.asarray(b.decode_attn(int(n), dctx[:, r],
                                                        None if dmax is None else dmax[:, r]),
                                          dtype=np.float64)
                               for r, n in enumerate(n_d) if n > 0]), axis=0)
        layer = t_lin + t_d
        # the launch model, LM head and in-situ factor of the busiest rank (GpuCostModel's)
        return (self.host_us(n_d, 0) + b.forward_us(busy, layer, busy)) * 1e-6

    def decode_step_s(self, n_d, c0, m0) -> float:
        """`decode_steps_s(n_d, c0, m0, 0, 1)[0]`: one decode-only step in plain floats (each
        rank's attention from its cached line or alone, `rank_attn1`; `forward_us` on a float
        takes the same IEEE operations as on an array)."""
        busy = max(n_d)
        if busy == 0:
            return 0.0
        b = self.base
        b._ensure(busy)
        dense = b._dense
        t_lin = max(dense[x] for x in n_d)
        t_d = max(self.rank_attn1(r, int(k), int(c), int(m))
                  for r, (k, c, m) in enumerate(zip(n_d, c0, m0)) if k > 0)
        return (b.iter_us + b.per_seq_us * busy + b.forward_us(busy, t_lin + t_d, busy)) * 1e-6

    def decode_steps_s(self, n_d, c0, m0, lo: int, n: int) -> np.ndarray:
        """`decode_only_s` of steps lo .. lo + n − 1 after a step whose ranks hold n_d decodes
        with Σ context c0 and longest m0 (every step adds n_d and 1): the same floats."""
        busy = max(n_d)
        if busy == 0:
            return np.zeros(n)
        if n == 1 and lo == 0:
            return np.array([self.decode_step_s(n_d, c0, m0)])
        b = self.base
        b._ensure(busy)
        dense = b._dense
        t_lin = max(dense[x] for x in n_d)
        lines = [self.rank_attn(r, int(k), int(c) + int(k) * lo, int(m) + lo, n)
                 for r, (k, c, m) in enumerate(zip(n_d, c0, m0)) if k > 0]
        # the ranks' elementwise maximum (np.max of their stack) in a fresh array (the lines
        # are views of the cache), then t_lin added in place
        if len(lines) == 1:
            t = lines[0] + t_lin
        else:
            t = np.maximum(lines[0], lines[1])
            for x in lines[2:]:
                np.maximum(t, x, out=t)
            t += t_lin
        return self._forward_s(busy, t)

    def _forward_s(self, busy: int, layer: np.ndarray) -> np.ndarray:
        """`(iter_us + per_seq_us·busy + base.forward_us(busy, layer, busy)) · 1e-6` for an
        array of per-layer times, computed in place (`GpuCostModel.layers_us` and `forward_us`'s
        operations in their order; addition commutes exactly)."""
        b = self.base
        t = b.forward_steps_us(busy, layer)
        t += b.iter_us + b.per_seq_us * busy
        t *= 1e-6
        return t

    def prefill_alone_s(self, prompt_tokens: int) -> float:
        """One whole prompt, sharded evenly over the R ranks, no decodes (Fig. 14b style)."""
        R = self.R
        n_p = [prompt_tokens // R + (1 if r < prompt_tokens % R else 0) for r in range(R)]
        return self.iteration_s(n_p, [0] * R, [0] * R, np.array([prompt_tokens]), np.array([0]), 1)

    # -- KV transfer at the prefill-to-decode transition --------------------------------------
    def shard_transfer_bytes(self, tokens: int) -> float:
        """Bytes each source rank's GPU sends to the decode rank's matching GPU: its 1/R head
        shard of the request's KV (all layers)."""
        return tokens * self.kv_bytes_per_token_gpu / self.R
