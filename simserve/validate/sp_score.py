"""Score measured Conflux Parallelism iterations (`sp_run`) against simserve's SP cost model and
ConfluxServe's latency estimator, and calibrate the contention factors α, β (torch-free).

Measured reference: the CUDA-graph replay of the overlapped iteration where it was captured,
else its queued eager time. α, β are fitted as the paper calibrates them (App. D: "from mixed
profiles"): the estimator's base functions stay as fitted from the single-GPU profile, and
(α, β) minimise its MAPE on one half of the batches (even indices), scored on the other half
(odd), then the other way round; the reported held-out MAPE pools both halves.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd

from simserve.cost_sp import PAPER_CONTENTION, SpCostModel
from simserve.errors import SimserveError
from simserve.hardware.profile import load_profile
from simserve.models import get_model
from simserve.policies.conflux.estimator import ConfluxEstimator, prefill_work
from simserve.policies.conflux.fit import fit_from_cost
from simserve.validate.score import summary
from simserve.validate.sp_batches import estimator_inputs, from_row, predict_sp

GRID = np.round(np.arange(1.0, 3.001, 0.01), 2)  # α, β ≥ 1: contention never speeds a path up


def load(folder: str) -> pd.DataFrame:
    path = os.path.join(folder, "sp_iterations.csv")
    if not os.path.exists(path):
        raise SimserveError(f"{folder}: no sp_iterations.csv (a folder written by "
                            "`python3 -m simserve.validate.sp_run`)")
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
    return cost, fit_from_cost(cost, alpha, beta)


def _paths(est: ConfluxEstimator, b: dict) -> tuple[float, float, float]:
    """The estimator's per-layer T_GEMM, T_P and T_D (NaN for an empty path)."""
    x = estimator_inputs(b)
    R = len(x["n_p"])
    t_gemm = est.gamma * max(p + d for p, d in zip(x["n_p"], x["n_d"])) + est.gamma0
    t_p = np.nan
    if sum(x["n_p"]):
        work = sum(prefill_work(ell, c) for ell, c in x["prefills"])
        t_p = est.a_comm * max(x["n_p"]) + est.a_comm0 + est.a_p * work / R + est.a_p0
    t_d = est.decode_path(x["n_d"], x["dctx"])
    return t_gemm, t_p, np.nan if t_d is None else t_d


def estimate(est: ConfluxEstimator, paths: np.ndarray, alpha, beta) -> np.ndarray:
    """T_iter (µs) for every batch (rows of paths: T_GEMM, T_P, T_D in s) and every (α, β)
    pair broadcast against them."""
    g, p, d = (paths[:, k][:, None] for k in range(3))
    a, b = np.atleast_1d(alpha)[None, :], np.atleast_1d(beta)[None, :]
    attn = np.fmax(b * p, a * d)  # fmax ignores the NaN of an empty path
    attn = np.where(np.isnan(attn), 0.0, attn)
    return est.num_layers * (g + attn) * 1e6


def fit_contention(est: ConfluxEstimator, paths: np.ndarray, measured: np.ndarray
                   ) -> tuple[float, float]:
    """(α, β) on GRID minimising the estimator's MAPE on these batches."""
    A, B = np.meshgrid(GRID, GRID, indexing="ij")
    pred = estimate(est, paths, A.ravel(), B.ravel())
    mape = np.mean(np.abs(pred - measured[:, None]) / measured[:, None], axis=0)
    k = int(np.argmin(mape))
    return float(A.ravel()[k]), float(B.ravel()[k])


def score(folder: str, model: str, profile: str = "h200-sxm", link: str = "nvlink4",
          ranks: int = 2) -> dict:
    df = load(folder)
    batches = [from_row(r) for r in df.to_dict("records")]
    cost, est = models(model, profile, link, ranks, PAPER_CONTENTION, PAPER_CONTENTION)
    pred = pd.DataFrame([predict_sp(cost, est, b) for b in batches], index=df.index)
    df = pd.concat([df, pred], axis=1)
    paths = np.array([_paths(est, b) for b in batches])
    meas = df["measured_us"].to_numpy(float)
    even = (df["i"].to_numpy() % 2) == 0
    held = np.empty(len(df))
    fitted = {}
    for name, train in (("even", even), ("odd", ~even)):
        a, b = fit_contention(est, paths[train], meas[train])
        fitted[f"fit_on_{name}"] = {"alpha": a, "beta": b}
        held[~train] = estimate(est, paths[~train], a, b)[:, 0]
    a_all, b_all = fit_contention(est, paths, meas)
    df["estimator_heldout_ab_us"] = held
    cost_fit, _ = models(model, profile, link, ranks, a_all, b_all)
    df["predicted_fit_ab_us"] = [predict_sp(cost_fit, est, b)["predicted_us"] for b in batches]
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
        "cost_model_paper_ab": summary(df, "predicted_us", "measured_us"),
        "cost_model_fit_ab": summary(df, "predicted_fit_ab_us", "measured_us"),
        "contention_fit_all": {"alpha": a_all, "beta": b_all}, **fitted,
        "paper_contention": PAPER_CONTENTION,
        # how much of the serial sum the overlapped split region takes (1: no overlap gained)
        "overlap_over_serial_median": float(np.median((split_meas / serial_meas)[both]))
        if both.any() else None,
        "graph_over_queued_median": float(np.median(df["overlap_graph_us"] / df["overlap_queued_us"]))
        if "overlap_graph_us" in df and df["overlap_graph_us"].notna().any() else None,
    }
    df.to_csv(os.path.join(folder, "sp_scored.csv"), index=False)
    with open(os.path.join(folder, "sp_summary.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def plot(folder: str, res: dict) -> str:
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
    path = os.path.join(folder, "sp_iterations.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
