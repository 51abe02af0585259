"""Profile-guided controls of DualPace §4.3 (policies.md §8.5–8.6), as plain functions.

- `gpu_token_limit`: the smallest batched-token count whose isotonic-fitted throughput is
  within δ of the plateau (mean of the last K fitted points).
- `cpu_batch_limit`: the CPU decode batch size with the highest throughput.
- `assist_thresholds`: Dense Assist routing thresholds (P, F) by Algorithm 1 with regret
  tolerance ε, from per-route scores S_r(b) = T_r(b) + λ·D_r(b) (Eq. 6–8).
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import isotonic_regression

from simserve.cost.assist_routes import (  # noqa: F401  (re-exported)
    ASSIST_HOST_US, RouteTimes, route_times_from)

ROUTES = ("full", "split", "fused")


def gpu_token_limit(tokens, throughput, k: int = 5, delta: float = 0.01) -> int:
    """Group points by batched tokens n (mean throughput per n), fit a non-decreasing curve
    (PAVA), take the plateau as the mean of the last k fitted values, return the smallest n
    whose fitted throughput is at least (1 − δ)·plateau. DualPace reports 1024 on the 4090."""
    n = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(throughput, dtype=np.float64)
    if n.shape != y.shape or n.size == 0:
        raise ValueError("tokens and throughput must be equal-length, non-empty")
    uniq, inv = np.unique(n, return_inverse=True)
    mean = np.bincount(inv, weights=y) / np.bincount(inv)
    fit = isotonic_regression(mean, increasing=True).x
    plateau = float(np.mean(fit[-min(k, len(fit)):]))
    idx = int(np.argmax(fit >= (1.0 - delta) * plateau))
    return int(uniq[idx])


def cpu_batch_limit(batches, throughput) -> int:
    """The batch size with the highest measured throughput (DualPace: 256 on the 4510)."""
    b = np.asarray(batches)
    y = np.asarray(throughput, dtype=np.float64)
    if b.shape != y.shape or b.size == 0:
        raise ValueError("batches and throughput must be equal-length, non-empty")
    return int(b[int(np.argmax(y))])


def route(p: int, f: int, b) -> np.ndarray:
    """π_{P,F}(b): 0 = Full-CPU (b ≤ F), 1 = Split-Final (F < b ≤ P), 2 = Fused-Assist (b > P)."""
    b = np.asarray(b)
    return np.where(b <= f, 0, np.where(b <= p, 1, 2))


def route_scores(rt: RouteTimes, num_layers: int, lam: float = 1.0) -> np.ndarray:
    """S_r(b) = T_r(b) + λ·D_r(b) for r in (full, split, fused): shape (3, len(B))."""
    N = num_layers
    t_full = N * rt.t_p + rt.t_l
    t_split = N * rt.t_p + rt.tw_ls
    t_fused = (N - 1) * rt.tw_p + rt.tw_la
    d_fused = (N - 1) * rt.d_p + rt.d_la
    return np.stack([t_full, t_split + lam * rt.d_ls, t_fused + lam * d_fused])


def assist_thresholds(batches, scores, num_layers: int, eps: float = 0.0025) -> tuple[int, int]:
    """Algorithm 1: among legal (P, F) — (0, 0) or F < P with P ∈ B and F ∈ B ∪ {0} — keep
    those within (1+ε) of the best mean score, then pick the fewest mean assist calls, then
    the lowest score, P and F. DualPace on the 4090: exact optimum (32, 0), chosen (32, 16)."""
    B = np.asarray(batches)
    S = np.asarray(scores, dtype=np.float64)
    if S.shape != (3, len(B)):
        raise ValueError(f"scores must have shape (3, {len(B)}) for routes {ROUTES}")
    calls = np.array([0.0, 1.0, float(num_layers)])
    cand = [(0, 0)] + [(int(p), int(f)) for p in B for f in [0, *B] if f < p]
    cols = np.arange(len(B))
    rows = []
    for p, f in cand:
        r = route(p, f, B)
        rows.append((float(S[r, cols].mean()), float(calls[r].mean()), p, f))
    best = min(r[0] for r in rows)
    ok = [r for r in rows if r[0] <= (1.0 + eps) * best]
    _, _, p, f = min(ok, key=lambda r: (r[1], r[0], r[2], r[3]))
    return p, f


# -- inputs from profiles ---------------------------------------------------------------------
TOKEN_LIMIT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
TOKEN_LIMIT_LENGTHS = (16, 32, 64, 128, 256, 512, 1024, 2048)
CPU_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CPU_CONTEXTS = (64, 128, 256, 512)   # DualPace Fig. 7b's context lengths
# Host launch + finalise of one Dense Assist on the GPU worker's service path (µs). Not
# measured here (no GPU in this project's loop for it): taken from DualPace §6.4 / Fig. 12, an
# ASSUMPTION named so. Fig. 12 splits an assist's GPU-side component time into host launch +
# finalise 30.0 % and CUDA 70.0 % (Llama-3.1-8B, RTX 4090) or 39.6 % / 60.4 % (Qwen3-32B,
# 4x H20), the CUDA segment taking 0.6-0.8 ms at b = 256 ("the fixed host-submission cost
# therefore becomes visible"). At the 0.7 ms midpoint: 0.7 x 30.0 / 70.0 = 0.300 ms on the
# 4090 platform, 0.7 x 39.6 / 60.4 = 0.459 ms on the H20 one; a fixed cost per assist. The
# paper notes launch and CUDA can partly overlap (component work, not serial latency); the
# GPU worker serialises them, so this is an upper bound on the assist's added latency.
# (Until 2026-12-01: 30 µs, a tenth of the paper's figure.)
ASSIST_HOST_US = 300.0
ASSIST_HOST_US_BY_GPU = {"rtx4090": 300.0, "h20": 459.0}


def assist_host_us(gpu_name: str) -> float:
    """Fig. 12's host cost for the paper's platform of this GPU; the 4090's elsewhere."""
    return ASSIST_HOST_US_BY_GPU.get(gpu_name, ASSIST_HOST_US)


def gpu_token_limit_from(gpu, model, tp: int = 1, k: int = 5, delta: float = 0.01) -> int:
    """§4.3: one decoder layer over a (B, L) grid of B prompts of L tokens, throughput
    n / time grouped by n = B·L, then `gpu_token_limit`."""
    ops = gpu.ops(model.name, tp)
    n, thr = [], []
    for b in TOKEN_LIMIT_BATCHES:
        for L in TOKEN_LIMIT_LENGTHS:
            tok = b * L
            t = sum(float(c(tok)) for c in ops.dense.values())
            t += b * ops.prefill_attn.us(np.array([L]), np.array([0]))
            n.append(tok)
            thr.append(tok / t)
    return gpu_token_limit(n, thr, k, delta)


def stage_wait_us(gpu, model, tp: int, token_limit: int) -> float:
    """Default q_x: an assist arriving at a random time while the GPU runs layers of a batch
    at its batched-token limit waits on average half a layer (residual of a busy stage)."""
    ops = gpu.ops(model.name, tp)
    layer = sum(float(c(token_limit)) for c in ops.dense.values())
    layer += float(ops.prefill_attn.us(np.array([token_limit]), np.array([0])))
    return 0.5 * layer


def cpu_layer_us(cpu_ops, batch: int, ctx: float) -> float:
    dense = sum(float(c(batch)) for c in cpu_ops.dense.values())
    return dense + float(cpu_ops.decode_attn.us(batch, batch * ctx))


def cpu_batch_limit_from(cpu_ops, batches=CPU_BATCHES, contexts=CPU_CONTEXTS) -> int:
    """§4.3: decode throughput of one CPU layer per batch size, averaged over contexts after
    normalising each context's curve by its maximum; the batch with the highest mean."""
    thr = np.array([[b / cpu_layer_us(cpu_ops, b, c) for b in batches] for c in contexts])
    thr /= thr.max(axis=1, keepdims=True)
    return cpu_batch_limit(batches, thr.mean(axis=0))
