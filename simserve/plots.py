"""Figures. Each function takes `ax=None` (or a figure for multi-panel plots) and returns
what it drew on, so notebooks can compose them."""
from __future__ import annotations

import numpy as np


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=(6, 4))
    return ax


def profile_fit_1d(points_x, points_us, curve, title: str, ax=None, xlabel="tokens"):
    """Measured medians (dots) and the fitted table (line), log-log."""
    ax = _axes(ax)
    ax.loglog(points_x, points_us, "o", ms=3, alpha=0.7, label="measured median")
    xs = np.geomspace(max(min(points_x), 1), max(points_x) * 2, 200)
    ax.loglog(xs, curve(xs), "-", lw=1.2, label="fit (beyond: roofline ratio)")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("time per call (µs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return ax


def profile_fit_grid(xv, yv, us, grid, title: str, ax=None, x_label="batch", y_label="context"):
    """One line per grid row x: measured medians (dots) and the fitted grid over y."""
    ax = _axes(ax)
    xv, yv, us = map(np.asarray, (xv, yv, us))
    rows = np.unique(xv)
    cmap = __import__("matplotlib").colormaps["viridis"]
    for i, x in enumerate(rows):
        m = xv == x
        color = cmap(i / max(len(rows) - 1, 1))
        ax.loglog(np.maximum(yv[m], 1), us[m], "o", ms=3, color=color)
        ys = np.geomspace(max(yv[m].min(), 1), yv[m].max(), 100)
        ax.loglog(ys, grid(x, ys), "-", lw=1, color=color, label=f"{x_label} {int(x)}")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(f"{y_label} (tokens)")
    ax.set_ylabel("time per layer (µs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    return ax
