"""Figures of a validation folder: predicted vs measured iteration times, and the replay's
TTFT / TPOT distributions, real executor against simulation."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd


def plot_folder(d: str, out_dir: str | None = None, fig_dir: str | None = None) -> list[str]:
    """Figures of the validation folder `d` (scored CSVs read from `out_dir`, default `d`;
    PNGs written to `fig_dir`, default where the scored CSVs are)."""
    scored = out_dir or d
    figs = fig_dir or scored
    os.makedirs(figs, exist_ok=True)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out = []
    sets = []
    g = os.path.join(scored, "gpu_scored.csv")
    if os.path.exists(g):
        sets.append(("GPU forward (CUDA graphs)", pd.read_csv(g), "graph_us", "predicted_graph_us",
                     "kind"))
    c = os.path.join(scored, "cpu_scored.csv")
    if os.path.exists(c):
        sets.append(("CPU decode iteration", pd.read_csv(c), "measured_us", "predicted_us", None))
    if sets:
        fig, axes = plt.subplots(1, len(sets), figsize=(5.2 * len(sets), 4.6), squeeze=False)
        for ax, (title, df, m, p, by) in zip(axes[0], sets):
            groups = df.groupby(by) if by else [("all", df)]
            for name, part in groups:
                ax.scatter(part[m] / 1e3, part[p] / 1e3, s=9, alpha=0.7, label=str(name))
            lo, hi = (df[[m, p]].min().min() / 1e3) * 0.8, (df[[m, p]].max().max() / 1e3) * 1.2
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            ax.plot([lo, hi], [lo * 1.05, hi * 1.05], "k:", lw=0.6)
            ax.plot([lo, hi], [lo / 1.05, hi / 1.05], "k:", lw=0.6)
            ape = np.abs(df[p] - df[m]) / df[m] * 100
            ax.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)",
                   title=f"{title}\nn={len(df)}, MAPE {ape.mean():.2f}%")
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(figs, "iterations.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    real, sim = (os.path.join(d, f"replay_{k}_requests.csv") for k in ("real", "sim"))
    if os.path.exists(real) and os.path.exists(sim):
        r, s = pd.read_csv(real), pd.read_csv(sim)
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, col, name in zip(axes, ("ttft_s", "tpot_s"), ("TTFT", "TPOT")):
            for df, label, style in ((r, "real executor", "-"), (s, "simulated", "--")):
                x = np.sort(df[col].dropna().to_numpy() * 1e3)
                ax.plot(x, np.arange(1, len(x) + 1) / len(x), style, label=label)
            ax.set(xscale="log", xlabel=f"{name} (ms)", ylabel="fraction of requests")
            ax.legend()
        fig.tight_layout()
        path = os.path.join(figs, "replay.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return out
