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

import numpy as np

from simserve.hardware.functions import Affine, Curve, Grid


class PrefillWork:
    kind = "work"

    def __init__(self, name: str, m: dict):
        self.curve = Curve.from_lists(name, m["work"], m["us"])  # extra keys (source) ignored
        self.per_request_us = float(m.get("per_request_us", 0.0))

    def us(self, chunks: np.ndarray, ctxs: np.ndarray) -> float:
        c = chunks.astype(np.float64)
        work = float((c * (ctxs + (c + 1.0) / 2.0)).sum())
        return float(self.curve(work)) + self.per_request_us * len(chunks)


class PrefillGrid:
    kind = "grid"

    def __init__(self, name: str, m: dict):
        self.grid = Grid.from_mapping(name, m)

    def us(self, chunks: np.ndarray, ctxs: np.ndarray) -> float:
        g = self.grid
        cmax = int(g.xs[-1])
        total = 0.0
        for c, x in zip(chunks.tolist(), ctxs.tolist()):
            # a chunk longer than the grid is the same causal work as consecutive pieces of the
            # longest measured chunk, each after the ones before it (time grows with c^2)
            while c > cmax:
                total += g.scalar(cmax, x)
                c, x = c - cmax, x + cmax
            total += g.scalar(c, x)
        return float(total)


class DecodeAffine:
    kind = "affine"

    def __init__(self, name: str, m: dict):
        a = Affine.from_mapping(name, m)
        self.const, self.per_seq = a.const_us, a.coef("per_seq")
        self.per_ctx = a.coef("per_context_token")

    def us(self, batch: int, ctx_sum):
        return self.const + self.per_seq * batch + self.per_ctx * ctx_sum


class DecodeGrid:
    kind = "grid"

    def __init__(self, name: str, m: dict):
        self.grid = Grid.from_mapping(name, m)

    def us(self, batch: int, ctx_sum):
        return self.grid(batch, np.asarray(ctx_sum, dtype=np.float64) / batch) \
            if np.ndim(ctx_sum) else float(self.grid(batch, ctx_sum / batch))


def prefill_fn(name: str, m: dict):
    return PrefillGrid(name, m) if m.get("kind") == "grid" else PrefillWork(name, m)


def decode_fn(name: str, m: dict):
    return DecodeGrid(name, m) if m.get("kind") == "grid" else DecodeAffine(name, m)
