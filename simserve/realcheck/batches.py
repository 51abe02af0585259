"""Random held-out batches for iteration-level validation, and their cost-model predictions.

GPU batches come in three kinds, a third each:
  - prefill: 1-3 chunks of 32-8K new tokens (log-uniform), each after no context (half of
    them) or 1K-16K cached tokens; a chunk samples (ends its prompt) with probability 1/2;
  - decode: 1-256 decodes (log-uniform) with contexts drawn log-uniform in 1K-16K each;
  - mixed: one such prefill chunk plus 1-256 such decodes.
Total new tokens stay within `max_tokens` and Σ decode context within `max_kv_tokens` (what
the GPU's KV pool could hold: a real engine never runs a larger batch).
CPU batches: 1-256 decodes (log-uniform) sharing one context drawn log-uniform in 64-8K, Σ
context within `max_cpu_kv_tokens`.
"""
from __future__ import annotations

import numpy as np

from simserve.cost import BatchShape


def _logu(rng, lo, hi):
    return int(round(float(np.exp(rng.uniform(np.log(lo), np.log(hi))))))


def _chunk(rng):
    n = _logu(rng, 32, 8192)
    ctx = 0 if rng.random() < 0.5 else _logu(rng, 1024, 16384)
    return n, ctx, bool(rng.random() < 0.5)


def _decodes(rng, max_kv_tokens):
    b = _logu(rng, 1, 256)
    c = [_logu(rng, 1024, 16384) for _ in range(b)]
    while sum(c) > max_kv_tokens:
        c.pop()
    return c


def gpu_batches(n: int, seed: int = 1, max_tokens: int = 16384,
                max_kv_tokens: int = 800_000) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = ("prefill", "decode", "mixed")[i % 3]
        b = {"kind": kind, "chunks": [], "chunk_ctx": [], "chunk_sample": [], "decode_ctx": []}
        if kind in ("prefill", "mixed"):
            for _ in range(int(rng.integers(1, 4)) if kind == "prefill" else 1):
                c, ctx, smp = _chunk(rng)
                if sum(b["chunks"]) + c > max_tokens:
                    break
                b["chunks"].append(c)
                b["chunk_ctx"].append(ctx)
                b["chunk_sample"].append(smp)
        if kind in ("decode", "mixed"):
            b["decode_ctx"] = _decodes(rng, max_kv_tokens)
        out.append(b)
    return out


def cpu_batches(n: int, seed: int = 2, max_cpu_kv_tokens: int = 400_000) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = _logu(rng, 1, 256)
        c = _logu(rng, 64, 8192)
        b = max(1, min(b, max_cpu_kv_tokens // c))
        out.append({"kind": "cpu_decode", "batch": b, "context": c})
    return out


def to_shape(b: dict) -> BatchShape:
    chunks = np.asarray(b["chunks"], dtype=np.int64)
    dec = np.asarray(b["decode_ctx"], dtype=np.int64)
    return BatchShape(num_tokens=int(chunks.sum()) + len(dec), prefill_chunks=chunks,
                      prefill_ctx=np.asarray(b["chunk_ctx"], dtype=np.int64),
                      num_decodes=len(dec), decode_ctx_sum=int(dec.sum()),
                      num_sample_rows=int(sum(b["chunk_sample"])) + len(dec), decode_ctx=dec)


def describe(b: dict) -> str:
    if b["kind"] == "cpu_decode":
        return f"cpu {b['batch']} decodes @ {b['context']}"
    parts = [f"{n}@{c}" for n, c in zip(b["chunks"], b["chunk_ctx"])]
    d = b["decode_ctx"]
    if d:
        parts.append(f"{len(d)} decodes, ctx sum {sum(d)} (max {max(d)})")
    return "; ".join(parts)


def predict_gpu_us(cost, b: dict) -> float:
    """The cost model's forward-pass time (scheduler overhead excluded), µs."""
    return cost.forward_s(to_shape(b)) * 1e6


def predict_cpu_us(cpu_cost, b: dict, layers: int) -> float:
    """Pre-layer + `layers` x (pre-attention + attention + post-attention) + post-layer, with
    the host scheduling overhead (profile `iteration_us`, `per_seq_us`) left out, µs."""
    s = cpu_cost.stage_us(b["batch"], b["batch"] * b["context"])
    host = cpu_cost.iter_us + cpu_cost.per_seq_us * b["batch"]
    layer = s["pre_attention"] + s["attention"] + s["post_attention"]
    return s["pre_layer"] - host + layers * layer + s["post_layer"]
