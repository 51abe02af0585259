"""Score measured Conflux Parallelism iterations (`sp_run`) against simserve's SP cost model and
ConfluxServe's latency estimator, and calibrate the contention factors α, β (torch-free).

Measured reference: the CUDA-graph replay of the overlapped iteration where it was captured,
else its queued eager time. α, β are fitted as the paper calibrates them (App. D: "from mixed
profiles"): the estimator's base functions stay as fitted from the single-GPU profile, and
(α, β) minimise its MAPE on one half of the batches (even indices), scored on the other half
(odd), then the other way round; the reported held-out MAPE pools both halves. The same is done
for simserve's SP cost model (its own α, β), and the estimator's form is also refitted whole
(all eight coefficients) to the measured half, to show what the paper's form can reach here.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pandas as pd

from simserve.cost.sp import PAPER_CONTENTION, SpCostModel
from simserve.errors import SimserveError
from simserve.hardware.profile import load_profile
from simserve.models import get_model
from simserve.policies.conflux.estimator import (CONTENTION_GRID, ConfluxEstimator, estimate_many,
                                                 fit_contention as est_fit_contention)
from simserve.policies.conflux.fit import fit_from_cost
from simserve.realcheck.score import summary
from simserve.realcheck.sp_batches import estimator_inputs, from_row, predict_sp, sample_rows

GRID = CONTENTION_GRID


def load(folder: str) -> pd.DataFrame:
    path = os.path.join(folder, "sp_iterations.csv")
    if not os.path.exists(path):
        raise SimserveError(f"{folder}: no sp_iterations.csv (a folder written by "
                            "`python3 -m simserve.realcheck.sp_run`)")
    df = pd.read_csv(path)
    missing = {"i", "kind", "chunks", "shards", "decode_ctx", "overlap_queued_us"} - set(df)
    if missing:
        raise SimserveError(f"{path}: missing column(s) {sorted(missing)}")
    meas = df["overlap_graph_us"] if "overlap_graph_us" in df else pd.Series(np.nan, index=df.index)
    df["measured_us"] = meas.where(meas.notna(), df["overlap_queued_us"])
    return df


def models(model: str, profile: str, link: str, ranks: int, alpha: float, beta: float
           ) -> tuple[SpCostModel, ConfluxEstimator]:
    cost = SpCostModel(get_model(model), load_profile(profile, "gpu"), load_profile(link, "link"),
                       ranks=ranks, tp=1, alpha=alpha, beta=beta)
    # the paper's form (affine f_D in Σ context) with γ0 holding the graph replay only: the
    # executor's forward has no host scheduling cost (`conflux` dispatches with a profiled f_D
    # and the host cost in γ0: fit.py)
    est = fit_from_cost(cost, alpha, beta, decode="affine", fixed_overheads=False)
    return cost, dataclasses.replace(est, literal=True)  # Eq. 2 to the letter


def _paths(est: ConfluxEstimator, b: dict) -> tuple[float, float, float]:
    x = estimator_inputs(b)
    return est.paths(x["n_p"], x["n_d"], x["dctx"], x["prefills"])


def estimate(est: ConfluxEstimator, paths: np.ndarray, alpha, beta) -> np.ndarray:
    """µs (the estimator is fitted in seconds)."""
    return estimate_many(est, paths, alpha, beta) * 1e6


def fit_contention(est: ConfluxEstimator, paths: np.ndarray, measured_us: np.ndarray):
    return est_fit_contention(est, paths, np.asarray(measured_us) * 1e-6, GRID)


def _cost_grid(cost: SpCostModel, b: dict, pred: dict, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The cost model's forward time (µs) of batch b for every (α, β) pair of A, B."""
    x = estimator_inputs(b)
    t_p, t_d = pred["tp_layer_us"], pred["td_layer_us"]
    if t_p > 0 and t_d > 0:
        split = np.minimum(np.maximum(B * t_p, A * t_d), t_p + t_d)
    else:
        split = np.full(A.shape, t_p + t_d)
    busy = max(p + d for p, d in zip(x["n_p"], x["n_d"]))
    rows = max(sample_rows(b, r) for r in range(len(x["n_p"])))
    cost.base._ensure(max(busy, rows))
    return np.asarray(cost.base.forward_us(busy, pred["lin_layer_us"] + split, rows), dtype=float)


def _argmin_mape(pred: np.ndarray, measured: np.ndarray) -> int:
    return int(np.argmin(np.mean(np.abs(pred - measured[:, None]) / measured[:, None], axis=0)))


def refit_estimator(batches: list[dict], measured: np.ndarray, num_layers: int,
                    ranks: int) -> ConfluxEstimator:
    """The paper's estimator form with all eight coefficients fitted to measured iterations
    (relative least squares; α = β = 1, as they only rescale the path coefficients here)."""
    from scipy.optimize import least_squares
    X = [estimator_inputs(b) for b in batches]

    def est_of(th):
        g, g0, ac, ac0, ap, ap0, ad, ad0 = np.exp(th) * SCALE
        return ConfluxEstimator(g, g0, ad, ad0, ac, ac0, ap, ap0, 1.0, 1.0, num_layers)

    def resid(th):
        e = est_of(th)
        return np.array([e.iteration_time(x["n_p"], x["n_d"], x["dctx"], x["prefills"]) * 1e6
                         for x in X]) / measured - 1.0
    r = least_squares(resid, np.zeros(8))
    return est_of(r.x)


# starting point / scale of the refit's coefficients (s per token, s, s per unit of work, ...)
SCALE = np.array([3e-8, 2e-5, 5e-8, 2e-5, 1e-12, 2e-5, 5e-11, 2e-5])


def score(folder: str, model: str, profile: str = "h200-sxm", link: str = "nvlink4",
          ranks: int = 2, out_dir: str | None = None) -> dict:
    """Scores `folder`'s SP iterations; with `out_dir`, writes sp_scored.csv and
    sp_summary.json there (nothing is written otherwise)."""
    df = load(folder)
    batches = [from_row(r) for r in df.to_dict("records")]
    cost, est = models(model, profile, link, ranks, PAPER_CONTENTION, PAPER_CONTENTION)
    preds = [predict_sp(cost, est, b) for b in batches]
    df = pd.concat([df, pd.DataFrame(preds, index=df.index)], axis=1)
    paths = np.array([_paths(est, b) for b in batches])
    meas = df["measured_us"].to_numpy(float)
    even = (df["i"].to_numpy() % 2) == 0
    A, B = (g.ravel() for g in np.meshgrid(GRID, GRID, indexing="ij"))
    cost_grid = np.array([_cost_grid(cost, b, p, A, B) for b, p in zip(batches, preds)])
    est_held, cost_held, refit_held = (np.empty(len(df)) for _ in range(3))
    fitted = {}
    for name, train in (("even", even), ("odd", ~even)):
        a, b = fit_contention(est, paths[train], meas[train])
        k = _argmin_mape(cost_grid[train], meas[train])
        fitted[f"fit_on_{name}"] = {"estimator": {"alpha": a, "beta": b},
                                    "cost_model": {"alpha": float(A[k]), "beta": float(B[k])}}
        est_held[~train] = estimate(est, paths[~train], a, b)[:, 0]
        cost_held[~train] = cost_grid[~train, k]
        re = refit_estimator([bb for bb, t in zip(batches, train) if t], meas[train],
                             cost.num_layers, ranks)
        refit_held[~train] = [re.iteration_time(**{k2: v for k2, v in estimator_inputs(bb).items()
                                                   if k2 in ("n_p", "n_d", "prefills")},
                                                decode_ctx=estimator_inputs(bb)["dctx"]) * 1e6
                              for bb, t in zip(batches, train) if not t]
    df["estimator_heldout_ab_us"] = est_held
    df["predicted_heldout_ab_us"] = cost_held
    df["estimator_refit_heldout_us"] = refit_held
    a_all, b_all = fit_contention(est, paths, meas)
    k_all = _argmin_mape(cost_grid, meas)
    L = cost.num_layers
    both = df[["tp_layer_us", "td_layer_us"]].gt(0).all(axis=1) & df["serial_queued_us"].notna()
    split_meas = (df["overlap_queued_us"] - df["linear_queued_us"]) / L
    serial_meas = (df["serial_queued_us"] - df["linear_queued_us"]) / L
    out = {
        "model": model, "profile": profile, "link": link, "ranks": ranks,
        "measured": "overlap_graph_us where captured, else overlap_queued_us",
        "n_graph": int(df["overlap_graph_us"].notna().sum()) if "overlap_graph_us" in df else 0,
        "estimator_paper_ab": summary(df, "estimator_us", "measured_us"),
        "estimator_heldout_ab": summary(df, "estimator_heldout_ab_us", "measured_us"),
        "estimator_refit_heldout": summary(df, "estimator_refit_heldout_us", "measured_us"),
        "cost_model_paper_ab": summary(df, "predicted_us", "measured_us"),
        "cost_model_heldout_ab": summary(df, "predicted_heldout_ab_us", "measured_us"),
        "contention_fit_all": {"estimator": {"alpha": a_all, "beta": b_all},
                               "cost_model": {"alpha": float(A[k_all]), "beta": float(B[k_all])}},
        **fitted, "paper_contention": PAPER_CONTENTION,
        # how much of the serial sum the overlapped split region takes (1: no overlap gained)
        "overlap_over_serial_median": float(np.median((split_meas / serial_meas)[both]))
        if both.any() else None,
        "graph_over_queued_median": float(np.median(df["overlap_graph_us"] / df["overlap_queued_us"]))
        if "overlap_graph_us" in df and df["overlap_graph_us"].notna().any() else None,
    }
    if out_dir:
        df.to_csv(os.path.join(out_dir, "sp_scored.csv"), index=False)
        with open(os.path.join(out_dir, "sp_summary.json"), "w") as f:
            json.dump(out, f, indent=1)
    return out


def plot(folder: str, res: dict, fig_dir: str | None = None) -> str:
    """Predicted vs measured SP iteration times of a scored folder (`sp_scored.csv`), written
    as sp_iterations.png to `fig_dir` (default the folder)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    df = pd.read_csv(os.path.join(folder, "sp_scored.csv"))
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 4.6))
    for ax, (col, title, key) in zip(axes, (
            ("estimator_heldout_ab_us", "ConfluxServe estimator (α, β held out)", "estimator_heldout_ab"),
            ("predicted_us", "simserve SP cost model (paper α, β)", "cost_model_paper_ab"))):
        for kind, part in df.groupby("kind"):
            ax.scatter(part["measured_us"] / 1e3, part[col] / 1e3, s=9, alpha=0.7, label=kind)
        lo = df[["measured_us", col]].min().min() / 1e3 * 0.8
        hi = df[["measured_us", col]].max().max() / 1e3 * 1.2
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (1.05, 1 / 1.05):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
        ax.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)",
               title=f"{title}\n{res['model']}, SP{res['ranks']}, n={len(df)}, "
                     f"MAPE {res[key]['all']['mape_pct']:.2f}%")
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(fig_dir or folder, exist_ok=True)
    path = os.path.join(fig_dir or folder, "sp_iterations.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fit_pooled(folders: list[str], profile: str = "h200-sxm", link: str = "nvlink4",
               ranks: int = 2) -> dict:
    """The cost model's (α, β) minimising the mean of the folders' MAPEs (each folder scored
    by `score` first: its sp_summary.json names the model), with each folder's error under the
    value fitted on the others alone (leave-one-model-out)."""
    grids, names = [], []
    A, B = (g.ravel() for g in np.meshgrid(GRID, GRID, indexing="ij"))
    for d in folders:
        path = os.path.join(d, "sp_summary.json")
        if not os.path.exists(path):
            raise SimserveError(f"{d}: no sp_summary.json; run `simserve validate sp-report` first")
        with open(path) as f:
            model = json.load(f)["model"]
        df = load(d)
        batches = [from_row(r) for r in df.to_dict("records")]
        cost, est = models(model, profile, link, ranks, PAPER_CONTENTION, PAPER_CONTENTION)
        g = np.array([_cost_grid(cost, b, predict_sp(cost, est, b), A, B) for b in batches])
        meas = df["measured_us"].to_numpy(float)
        grids.append(np.mean(np.abs(g - meas[:, None]) / meas[:, None], axis=0) * 100)
        names.append(f"{model} ({len(df)} batches)")
    mapes = np.array(grids)
    k = int(np.argmin(mapes.mean(axis=0)))
    out = {"alpha": float(A[k]), "beta": float(B[k]), "n_folders": len(folders),
           "mape_pct": {n: round(float(m[k]), 2) for n, m in zip(names, mapes)},
           "paper_mape_pct": {n: round(float(m[int(np.argmin(np.abs(A - PAPER_CONTENTION)
                                                             + np.abs(B - PAPER_CONTENTION)))]), 2)
                              for n, m in zip(names, mapes)}}
    if len(folders) > 1:
        held = {}
        for i, n in enumerate(names):
            others = np.delete(mapes, i, axis=0).mean(axis=0)
            j = int(np.argmin(others))
            held[n] = {"alpha": float(A[j]), "beta": float(B[j]), "mape_pct": round(float(mapes[i, j]), 2)}
        out["leave_one_model_out"] = held
    out["source"] = (f"simserve validate sp-fit on {', '.join(names)} ({', '.join(folders)}): "
                     f"Conflux Parallelism iterations on {ranks} real GPUs, CUDA-graph replays")
    return out


def write_raw(res: dict, raw_dir: str) -> str:
    if not os.path.isdir(raw_dir):
        raise SimserveError(f"--raw {raw_dir}: no such folder (the profile's raw points)")
    path = os.path.join(raw_dir, "sp_contention.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    return path
