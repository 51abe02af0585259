"""The ConfluxServe estimator fitted from simserve's cost model, as the paper fits it from
offline profiles (§6.2 "Estimator construction", App. D): each base function is sampled in
isolation over its workload range and fitted by NNLS to an affine form; α and β are then
calibrated on mixed iterations of the cost model (the paper calibrates them from mixed
profiles of the hardware), unless given. Units: seconds per layer.

The shared-linear samples carry the iteration's fixed host cost (scheduling, graph replay)
spread over the layers, as App. D's γ0 "absorbs fixed execution overheads".
"""
from __future__ import annotations

import dataclasses

import numpy as np

from simserve.cost_sp import SpCostModel

from simserve.policies.conflux.estimator import (ConfluxEstimator, fit_contention, fit_estimator,
                                                 prefill_work)

_US = 1e-6


def gemm_grid(max_tokens: int, quantum: int = 16) -> np.ndarray:
    """Rank-local token counts sampled for f_GEMM: every quantum step up to 1K, sparser beyond."""
    lo = np.arange(quantum, min(1024, max_tokens) + 1, quantum)
    hi = np.arange(1024, max_tokens + 1, 256)
    return np.unique(np.concatenate([lo, hi]))


def mixed_shapes(R: int, max_tokens: int):
    """Mixed iterations for calibrating α, β: a prefill of ℓ tokens after c cached ones, sharded
    evenly, beside B decodes of context k on every rank (ℓ, c, B, k over the serving range)."""
    for ell in (512, 2048, 4096, 8192):
        if ell > R * max_tokens:
            continue
        for c in (0, 8192):
            for B in (8, 32, 64, 128):
                for k in (2048, 8192):
                    n_p = [ell // R + (1 if r < ell % R else 0) for r in range(R)]
                    yield n_p, [B] * R, [B * k] * R, [k] * R, [ell], [c]


def calibrate_contention(cost: SpCostModel, est: ConfluxEstimator,
                         max_tokens: int = 8192) -> ConfluxEstimator:
    """α, β of the estimator fitted to the cost model's mixed iterations (forward pass, host
    scheduling left out), as the paper calibrates them from mixed profiles (App. D)."""
    paths, target = [], []
    for n_p, n_d, dctx, dmax, chunks, ctxs in mixed_shapes(cost.R, max_tokens):
        if max(p + d for p, d in zip(n_p, n_d)) > max_tokens:
            continue
        it = cost.iteration_s(n_p, n_d, dctx, np.array(chunks), np.array(ctxs), max(n_d), dmax)
        target.append(it - cost.host_us(n_d, len(chunks)) * _US)
        paths.append(est.paths(n_p, n_d, dctx, list(zip(chunks, ctxs))))
    if not paths:
        return est
    a, b = fit_contention(est, np.array(paths), np.array(target))
    return dataclasses.replace(est, alpha=a, beta=b)


def fit_from_cost(cost: SpCostModel, alpha: float | None = None, beta: float | None = None,
                  max_tokens: int = 8192, quantum: int = 16) -> ConfluxEstimator:
    """The estimator's base functions from isolated samples of the cost model; α, β as given,
    or (None) calibrated against the cost model's mixed iterations (`calibrate_contention`)."""
    b, L, R = cost.base, cost.num_layers, cost.R
    n = gemm_grid(max_tokens, quantum)
    # per layer: the launch model and in-situ factor applied to the dense time (no LM head)
    gemm = [b.forward_us(int(x), b.dense_layer_us(int(x)), 0) / L * _US for x in n]
    bs, ctxs = (8, 16, 32, 64, 128), (512, 1024, 2048, 4096, 8192, 16384)
    w_d = [B * c for B in bs for c in ctxs]
    # attention and communication run inside whole forwards too: each sample carries the
    # cost model's in-situ factor at the tokens the rank would hold in such an iteration
    dec = [float(b.decode_attn(B, B * c)) * b.in_situ(B) * _US for B in bs for c in ctxs]
    chunks, pctx = (128, 256, 512, 1024, 2048, 4096, 8192), (0, 2048, 8192, 16384)
    w_p = [prefill_work(l, c) / R for l in chunks for c in pctx]
    pre = [float(cost.sp_prefill_attn(np.array([l]), np.array([c])))
           * b.in_situ(max(1, l // R)) * _US for l in chunks for c in pctx]
    comm = [cost.comm_us(int(x)) * b.in_situ(int(x)) * _US for x in n]
    est = fit_estimator({"gemm": (n, gemm), "decode_attn": (w_d, dec),
                         "prefill_attn": (w_p, pre), "comm": (n, comm)},
                        num_layers=L, alpha=alpha or 1.0, beta=beta or 1.0)
    if alpha is None or beta is None:
        cal = calibrate_contention(cost, est, max_tokens)
        est = dataclasses.replace(est, alpha=alpha or cal.alpha, beta=beta or cal.beta)
    return est
