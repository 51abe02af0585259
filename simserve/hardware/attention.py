"""Attention latency functions of one layer on one rank, in the two forms profiles use.

Prefill (per chunk of `chunk` new tokens after `ctx` cached ones):
  - `work`: f(W) + per_request_us with W = chunk·(ctx + (chunk+1)/2)  (derived profiles)
  - `grid`: t(chunk, ctx) measured on a grid (a short chunk over a long context is
    memory-bound, which W alone cannot say), summed over the chunks of a batch.
Decode (B sequences, ΣC cached tokens in all):
  - `affine`: const + per_seq·B + per_context_token·ΣC  (derived profiles)
  - `grid`: t(B, ΣC/B) measured on a batch × context grid.
`varlen` (optional): the extra cost per decode context token when decodes ride in the same
variable-length attention call as prefill chunks instead of their own decode kernel.
"""
from __future__ import annotations

import math

import numpy as np

from simserve.hardware.functions import Affine, Curve, Grid

_SCALARS = (int, float, np.integer, np.floating)


class PrefillWork:
    kind = "work"

    def __init__(self, name: str, m: dict):
        self.curve = Curve.from_lists(name, m["work"], m["us"])  # extra keys (source) ignored
        self.per_request_us = float(m.get("per_request_us", 0.0))

    def us(self, chunks, ctxs) -> float:
        """Arrays or lists of the chunks' new and cached tokens."""
        c = np.asarray(chunks).astype(np.float64)
        work = float((c * (np.asarray(ctxs) + (c + 1.0) / 2.0)).sum())
        return float(self.curve(work)) + self.per_request_us * len(chunks)


class PrefillGrid:
    kind = "grid"

    def __init__(self, name: str, m: dict):
        self.grid = Grid.from_mapping(name, m)
        self._at = None  # grid.scalar as its closure (`Grid.scalar_fn`: the same floats)

    def __getstate__(self) -> dict:
        """Without the closure, a cache rebuilt on first use: compiled, it does not pickle, and
        a sweep sends resolved hardware to Dask and Ray workers."""
        return {**self.__dict__, "_at": None}

    def us(self, chunks, ctxs) -> float:
        """Arrays or lists of the chunks' new and cached tokens (lists of ints save two
        conversions; the sum is the same)."""
        at = self._at
        if at is None:
            at = self._at = self.grid.scalar_fn()
        cmax = int(self.grid.xs[-1])
        total = 0.0
        for c, x in zip(chunks if type(chunks) is list else chunks.tolist(),
                        ctxs if type(ctxs) is list else ctxs.tolist()):
            # a chunk longer than the grid is the same causal work as consecutive pieces of the
            # longest measured chunk, each after the ones before it (time grows with c^2)
            while c > cmax:
                total += at(cmax, x)
                c, x = c - cmax, x + cmax
            total += at(c, x)
        return float(total)


class DecodeAffine:
    kind = "affine"

    def __init__(self, name: str, m: dict):
        a = Affine.from_mapping(name, m)
        self.const, self.per_seq = a.const_us, a.coef("per_seq")
        self.per_ctx = a.coef("per_context_token")

    def us(self, batch: int, ctx_sum, ctx_max=None):
        return self.const + self.per_seq * batch + self.per_ctx * ctx_sum


class SplitImbalance:
    """Unequal contexts in a split-K paged decode kernel (the Triton kernel calibration times).

    The kernel runs batch × kv_heads × s programs, s splits per sequence chosen from the
    longest context (as many as fill `target_programs`, none shorter than `min_split_tokens`,
    lengths rounded up to `block_n`); a program streams its split at about
    `program_tokens_per_us`. The grid was measured with equal contexts, where every program
    is equally long; with unequal ones the longest program, L tokens, sets a tail. Time:
        grid(B, ΣC/B) · g(L / (r · grid)) / g(L_eq / (r · grid)),  g(x) = sqrt(1 + x²)
    (a smooth max of the bandwidth-bound time and the longest program), with L_eq the
    longest program at equal contexts, so equal contexts give the grid exactly. r is fitted
    to calibration's mixed-context points (`simserve calibrate fit`)."""

    def __init__(self, m: dict):
        self.target = int(m["target_programs"])
        self.min_split = int(m["min_split_tokens"])
        self.block = int(m["block_n"])
        self.kv_heads = int(m["kv_heads"])
        self.rate = float(m["program_tokens_per_us"])

    def longest(self, batch: int, max_len):
        m = np.asarray(max_len, dtype=np.int64)
        s = np.maximum(1, np.minimum(-(-self.target // (batch * self.kv_heads)),
                                     -(-m // self.min_split)))
        split = -(-(-(-m // s)) // self.block) * self.block
        return np.minimum(m, split)

    def longest_run(self, batch: int, m0: int, k: int) -> np.ndarray:
        """`longest(batch, m0 + arange(k))` from a table per split cap (a view, no copy)."""
        return self.run_table(batch, m0 + k)[m0:m0 + k]

    def run_table(self, batch: int, top: int) -> np.ndarray:
        """The table `longest_run` slices: `longest(batch, m)` at index m, for m < top at
        least (one array per split cap, grown by doubling)."""
        cap = -(-self.target // (batch * self.kv_heads))
        tables = self.__dict__.setdefault("_runs", {})
        tab = tables.get(cap)
        if tab is None or len(tab) < top:
            n = max(top, 2 * len(tab) if tab is not None else 1 << 14)
            m = np.arange(n, dtype=np.int64)
            s = np.maximum(1, np.minimum(cap, -(-m // self.min_split)))
            tab = tables[cap] = np.minimum(m, -(-(-(-m // s)) // self.block) * self.block)
        return tab

    def factor(self, batch: int, ctx_sum, ctx_max, base_us):
        if (isinstance(ctx_sum, _SCALARS) and isinstance(ctx_max, _SCALARS)) or (
                not np.ndim(ctx_sum) and not np.ndim(ctx_max)):  # one step: plain numbers,
            return _factor1(int(batch), int(ctx_sum), int(ctx_max), float(base_us),
                            -(-self.target // (batch * self.kv_heads)), self.min_split,
                            self.block, self.rate)  # the same IEEE operations as below
        eq = -(-np.asarray(ctx_sum, dtype=np.int64) // batch)
        scale = 1.0 / (self.rate * np.maximum(base_us, 1e-9))
        x = self.longest(batch, ctx_max) * scale
        xe = self.longest(batch, eq) * scale
        f = np.sqrt(1.0 + x * x) / np.sqrt(1.0 + xe * xe)
        return np.where(np.asarray(ctx_max) <= eq, 1.0, f)


def _longest_one(m: int, cap: int, min_split: int, block: int) -> int:
    """`SplitImbalance.longest` of one context m, with at most `cap` splits."""
    s = max(1, min(cap, -(-m // min_split)))
    return min(m, -(-(-(-m // s)) // block) * block)


def _factor1(batch: int, ctx_sum: int, ctx_max: int, base_us: float, cap: int,
             min_split: int, block: int, rate: float) -> float:
    """`SplitImbalance.factor` of one step (plain numbers; C types when compiled,
    attention.pxd)."""
    eq = -(-ctx_sum // batch)
    if ctx_max <= eq:
        return 1.0
    scale = 1.0 / (rate * (1e-9 if 1e-9 > base_us else base_us))  # max(base_us, 1e-9)
    x = _longest_one(ctx_max, cap, min_split, block) * scale
    xe = _longest_one(eq, cap, min_split, block) * scale
    return math.sqrt(1.0 + x * x) / math.sqrt(1.0 + xe * xe)


class DecodeGrid:
    kind = "grid"

    def __init__(self, name: str, m: dict):
        self.grid = Grid.from_mapping(name, m)
        imb = m.get("imbalance")
        self.imbalance = SplitImbalance(imb) if imb else None

    def us(self, batch: int, ctx_sum, ctx_max=None):
        """µs for `batch` decodes with Σ context `ctx_sum`; with `ctx_max` (the longest
        context; arrays allowed) unequal contexts are priced too."""
        if isinstance(ctx_sum, _SCALARS):  # one step: the scalar path, the same floats
            base = self.grid.at(batch, ctx_sum / batch)
        elif np.ndim(ctx_sum):
            base = self.grid(batch, np.asarray(ctx_sum, dtype=np.float64) / batch)
        else:
            base = float(self.grid(batch, ctx_sum / batch))
        if ctx_max is None or self.imbalance is None:
            return base
        f = self.imbalance.factor(batch, ctx_sum, ctx_max, base)
        if isinstance(f, float):
            return float(base * f)
        return base * f if np.ndim(f) else float(base * f)


def decode_steps_us(fn, batch: int, s0: int, m0: int, k: int) -> np.ndarray:
    """`fn.us(batch, S, M)` for k consecutive decode steps of `batch` sequences, S = s0 +
    batch·j and M = m0 + j (j < k): the same floats as the array call, in fewer numpy calls
    (the unequal-context factor depends on M - ceil(S / batch), constant over the steps)."""
    j = _arange(k)
    if not isinstance(fn, DecodeGrid):
        return fn.us(batch, s0 + batch * j, m0 + j)
    S = j * batch
    S += s0
    y = S / batch
    base = fn.grid.rising(batch, s0 / batch, y)
    imb = fn.imbalance
    e0 = -(-s0 // batch)
    if imb is None or m0 <= e0:  # equal contexts: factor 1 at every step
        return base
    scale = np.maximum(base, 1e-9)
    scale *= imb.rate
    np.divide(1.0, scale, out=scale)
    x = imb.longest_run(batch, m0, k) * scale
    xe = imb.longest_run(batch, e0, k) * scale
    x *= x
    x += 1.0
    np.sqrt(x, out=x)
    xe *= xe
    xe += 1.0
    np.sqrt(xe, out=xe)
    x /= xe
    x *= base
    return x


_ARANGE = np.arange(1 << 12, dtype=np.int64)


def _arange(k: int) -> np.ndarray:
    global _ARANGE
    if k > len(_ARANGE):
        _ARANGE = np.arange(max(k, 2 * len(_ARANGE)), dtype=np.int64)
    return _ARANGE[:k]


def prefill_fn(name: str, m: dict):
    return PrefillGrid(name, m) if m.get("kind") == "grid" else PrefillWork(name, m)


def decode_fn(name: str, m: dict):
    return DecodeGrid(name, m) if m.get("kind") == "grid" else DecodeAffine(name, m)
