"""The in-situ factor: whole forward passes (real executor) over the sum of separately timed
kernels (cost model), as a function of batch tokens, with its out-of-fold error.

Separately timed kernels miss what a whole forward does to them: at a few tokens a replayed
graph overlaps more than the fitted per-kernel overlap; at thousands of tokens sustained
tensor-core load runs below the clocks a short isolated GEMM sees. The factor is
exp(θ(log2 T)), θ piecewise linear through knots, least squares on log(measured/predicted).
Two-fold cross-validation (points split by index parity) gives the held-out error: every
point is scored by a factor fitted without it.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from simserve.cost import GpuCostModel
from simserve.hardware.profile import load_profile
from simserve.models import get_model
from simserve.realcheck import batches as vb
from simserve.realcheck.store import load_gpu_points

KNOTS = [1, 16, 64, 256, 1024, 4096, 16384]


def _basis(tokens, knots) -> np.ndarray:
    lx = np.log2(np.maximum(np.asarray(tokens, float), 1.0))
    lk = np.log2(np.asarray(knots, float))
    eye = np.eye(len(knots))
    return np.stack([np.interp(lx, lk, eye[k]) for k in range(len(knots))], 1)


def fit_log_factor(tokens, measured, predicted, knots=KNOTS) -> np.ndarray:
    A = _basis(tokens, knots)
    y = np.log(np.asarray(measured, float) / np.asarray(predicted, float))
    theta, *_ = np.linalg.lstsq(A, y, rcond=None)
    return np.exp(theta)


def apply(tokens, predicted, factor, knots=KNOTS) -> np.ndarray:
    return np.asarray(predicted, float) * np.exp(_basis(tokens, knots) @ np.log(factor))


def bare_profile(name: str, kind: str):
    """The profile without its in-situ factor: what the factor is fitted against."""
    prof = load_profile(name, expect_kind=kind)
    oh = {k: v for k, v in prof.overheads.items() if k != "in_situ"}
    return dataclasses.replace(prof, overheads=oh, _ops_cache={})


def raw_predictions(points, profile: str, model: str) -> np.ndarray:
    """Graph-mode forward predictions with the in-situ factor removed from the profile."""
    cost = GpuCostModel(get_model(model), bare_profile(profile, "gpu"), 1,
                        graph_max_tokens=1 << 30)
    return np.array([vb.predict_gpu_us(cost, p) for p in points])


def cpu_predictions(df, prof, model: str) -> np.ndarray:
    """CPU iteration predictions (µs) for rows with batch, context, layers and threads."""
    from simserve.cost.cpu import CpuCostModel
    models: dict = {}
    out = []
    for r in df.itertuples(index=False):
        th = int(r.threads)
        if th not in models:
            models[th] = CpuCostModel(get_model(model), prof, th)
        out.append(vb.predict_cpu_us(models[th], {"batch": int(r.batch), "context": int(r.context)},
                                     int(r.layers)))
    return np.array(out)


def _fit_held_out(x, meas, pred, fold, knots) -> dict:
    """The factor fitted on all points, and each fold's points scored by a factor fitted on
    the other folds (MAPE without the factor, held out, in sample, per fold)."""
    oof = np.empty(len(meas))
    per_fold = {}

    def mape(p, m=meas):
        return float(np.mean(np.abs(p - m) / m) * 100)

    for part in np.unique(fold):
        train, test = fold != part, fold == part
        oof[test] = apply(x[test], pred[test], fit_log_factor(x[train], meas[train], pred[train],
                                                              knots), knots)
        per_fold[int(part)] = round(mape(oof[test], meas[test]), 2)
    full = fit_log_factor(x, meas, pred, knots)
    return {"tokens": list(knots), "factor": [round(float(v), 4) for v in full], "n": len(meas),
            "mape_without_pct": round(mape(pred), 2), "mape_out_of_fold_pct": round(mape(oof), 2),
            "mape_in_sample_pct": round(mape(apply(x, pred, full, knots)), 2),
            "mape_per_fold_pct": per_fold}


def fit(points_csv: str, profile: str, model: str, knots=KNOTS) -> dict:
    """GPU forward passes by batch tokens; held out two-fold by index parity."""
    pts = load_gpu_points(points_csv)
    T = np.array([sum(p["chunks"]) + len(p["decode_ctx"]) for p in pts])
    meas = np.array([p["graph_us"] for p in pts])
    r = _fit_held_out(T, meas, raw_predictions(pts, profile, model), np.arange(len(pts)) % 2,
                      knots)
    return dict(r, held_out="2-fold CV",
                source=f"simserve validate fit on {len(pts)} {model} forward passes "
                       f"({Path(points_csv).as_posix()}), CUDA-graph replays on the real executor")


CPU_KNOTS = [1, 4, 16, 64, 256]


def fit_cpu(points_csvs, profile: str, model: str, knots=CPU_KNOTS) -> dict:
    """As `fit`, for CPU decode iterations against the CPU cost model, by decode batch. With
    several runs (e.g. separate boots of a VM whose host bandwidth varies), the held-out error
    is leave-one-run-out; with one, two-fold by index parity."""
    import pandas as pd
    if isinstance(points_csvs, str):
        points_csvs = [points_csvs]
    df = pd.concat([pd.read_csv(p).assign(run=k) for k, p in enumerate(points_csvs)],
                   ignore_index=True)
    fold = df.run.to_numpy() if len(points_csvs) > 1 else np.arange(len(df)) % 2
    how = "leave-one-run-out" if len(points_csvs) > 1 else "2-fold CV"
    r = _fit_held_out(df.batch.to_numpy(), df.measured_us.to_numpy(float),
                      cpu_predictions(df, bare_profile(profile, "cpu"), model), fold, knots)
    return dict(r, held_out=how,
                source=f"simserve validate fit on {len(df)} {model} CPU decode iterations from "
                       f"{len(points_csvs)} run(s) "
                       f"({', '.join(Path(p).parent.name for p in points_csvs)}) "
                       f"on the real CPU executor; held out {how}")


def write(result: dict, raw_dir: str, name: str) -> Path:
    """Store a factor next to the raw kernel points, where `simserve calibrate fit` reads it."""
    p = Path(raw_dir) / name
    p.write_text(json.dumps(result, indent=1) + "\n")
    return p
