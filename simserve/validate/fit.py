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
from simserve.validate import batches as vb
from simserve.validate.store import load_gpu_points

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


def raw_predictions(points, profile: str, model: str) -> np.ndarray:
    """Graph-mode forward predictions with the in-situ factor removed from the profile."""
    prof = load_profile(profile, expect_kind="gpu")
    oh = {k: v for k, v in prof.overheads.items() if k != "in_situ"}
    bare = dataclasses.replace(prof, overheads=oh, _ops_cache={})
    cost = GpuCostModel(get_model(model), bare, 1, graph_max_tokens=1 << 30)
    return np.array([vb.predict_gpu_us(cost, p) for p in points])


def fit(points_csv: str, profile: str, model: str, knots=KNOTS) -> dict:
    pts = load_gpu_points(points_csv)
    T = np.array([sum(p["chunks"]) + len(p["decode_ctx"]) for p in pts])
    meas = np.array([p["graph_us"] for p in pts])
    pred = raw_predictions(pts, profile, model)
    idx = np.arange(len(pts))
    oof = np.empty(len(pts))
    for part in (0, 1):
        train, test = idx % 2 != part, idx % 2 == part
        f = fit_log_factor(T[train], meas[train], pred[train], knots)
        oof[test] = apply(T[test], pred[test], f, knots)
    full = fit_log_factor(T, meas, pred, knots)

    def mape(p):
        return float(np.mean(np.abs(p - meas) / meas) * 100)

    return {"tokens": list(knots), "factor": [round(float(x), 4) for x in full],
            "n": len(pts), "mape_without_pct": round(mape(pred), 2),
            "mape_out_of_fold_pct": round(mape(oof), 2),
            "mape_in_sample_pct": round(mape(apply(T, pred, full, knots)), 2),
            "source": f"simserve validate fit on {len(pts)} {model} forward passes "
                      f"({Path(points_csv).as_posix()}), CUDA-graph replays on the real executor"}


def write(result: dict, raw_dir: str) -> Path:
    """Store the factor next to the raw kernel points, where `simserve calibrate fit` reads it."""
    p = Path(raw_dir) / "in_situ.json"
    p.write_text(json.dumps(result, indent=1) + "\n")
    return p


CPU_KNOTS = [1, 4, 16, 64, 256]


def raw_cpu_predictions(df, profile: str, model: str) -> np.ndarray:
    from simserve.cost_cpu import CpuCostModel
    prof = load_profile(profile, expect_kind="cpu")
    oh = {k: v for k, v in prof.overheads.items() if k != "in_situ"}
    bare = dataclasses.replace(prof, overheads=oh, _ops_cache={})
    models = {}
    out = []
    for r in df.itertuples(index=False):
        th = int(r.threads)
        if th not in models:
            models[th] = CpuCostModel(get_model(model), bare, th)
        out.append(vb.predict_cpu_us(models[th], {"batch": int(r.batch), "context": int(r.context)},
                                     int(r.layers)))
    return np.array(out)


def fit_cpu(points_csvs, profile: str, model: str, knots=CPU_KNOTS) -> dict:
    """As `fit`, for CPU decode iterations against the CPU cost model, by decode batch. With
    several runs (e.g. separate boots of a VM whose host bandwidth varies), the held-out error
    is leave-one-run-out; with one, two-fold by index parity."""
    import pandas as pd
    if isinstance(points_csvs, str):
        points_csvs = [points_csvs]
    frames = [pd.read_csv(p).assign(run=k) for k, p in enumerate(points_csvs)]
    df = pd.concat(frames, ignore_index=True)
    B, meas = df.batch.to_numpy(), df.measured_us.to_numpy(float)
    pred = raw_cpu_predictions(df, profile, model)
    fold = df.run.to_numpy() if len(frames) > 1 else np.arange(len(df)) % 2
    oof = np.empty(len(df))
    per_fold = {}

    def mape(p, m=meas):
        return float(np.mean(np.abs(p - m) / m) * 100)

    for part in np.unique(fold):
        train, test = fold != part, fold == part
        oof[test] = apply(B[test], pred[test], fit_log_factor(B[train], meas[train], pred[train],
                                                              knots), knots)
        per_fold[int(part)] = round(mape(oof[test], meas[test]), 2)
    full = fit_log_factor(B, meas, pred, knots)
    how = "leave-one-run-out" if len(frames) > 1 else "2-fold CV"
    return {"tokens": list(knots), "factor": [round(float(x), 4) for x in full], "n": len(df),
            "mape_without_pct": round(mape(pred), 2), "mape_out_of_fold_pct": round(mape(oof), 2),
            "mape_in_sample_pct": round(mape(apply(B, pred, full, knots)), 2),
            "held_out": how, "mape_per_fold_pct": per_fold,
            "source": f"simserve validate fit on {len(df)} {model} CPU decode iterations from "
                      f"{len(frames)} run(s) ({', '.join(Path(p).parent.name for p in points_csvs)}) "
                      f"on the real CPU executor; held out {how}"}
