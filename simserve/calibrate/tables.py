"""Raw calibration points → monotone knot tables, and the held-out check of those tables.

No torch here: this runs anywhere the raw CSVs are (`hwprofiles/raw/NAME/*.csv`).

1-D tables (dense ops, elementwise ops, LM head, copies): the median time per x, made
non-decreasing by isotonic regression (PAVA), evaluated by linear interpolation (`Curve`).
2-D tables (prefill attention over chunk × context, decode attention over batch × context):
a rectangular grid of medians, non-decreasing along both axes, evaluated by bilinear
interpolation in (log2 x, log2 y) (`Grid`). `holdout_errors` removes every fourth interior
point, refits, and returns the relative errors at the removed points.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import isotonic_regression

from simserve.hardware.functions import Curve, Grid
from simserve.hardware.raw import read_raw  # noqa: F401  (re-exported)


def monotone_1d(x, y) -> tuple[np.ndarray, np.ndarray]:
    """Median per distinct x, then the non-decreasing least-squares fit (PAVA)."""
    s = pd.Series(np.asarray(y, dtype=np.float64)).groupby(np.asarray(x, dtype=np.float64)).median()
    xs = s.index.to_numpy(dtype=np.float64)
    ys = isotonic_regression(s.to_numpy(), increasing=True).x
    return xs, ys


def fit_curve(name: str, x, y) -> Curve:
    xs, ys = monotone_1d(x, y)
    return Curve.from_lists(name, xs, ys)


def grid_from_points(xv, yv, t) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rectangular median grid over (x, y); missing cells filled along y, then made monotone
    along both axes (a cumulative max, which only raises cells below a measured neighbour)."""
    df = pd.DataFrame({"x": np.asarray(xv, float), "y": np.asarray(yv, float),
                       "t": np.asarray(t, float)})
    piv = df.pivot_table(index="x", columns="y", values="t", aggfunc="median")
    xs = piv.index.to_numpy(float)
    ys = piv.columns.to_numpy(float)
    g = piv.to_numpy(float).copy()
    ly = np.log2(np.maximum(ys, 1.0))
    for i in range(len(xs)):  # fill holes of a row by log-log interpolation along y
        row = g[i]
        ok = ~np.isnan(row)
        if ok.sum() == 0:
            raise ValueError(f"grid row x={xs[i]} has no measured point")
        if not ok.all():
            fill = np.exp(np.interp(ly[~ok], ly[ok], np.log(row[ok])))
            last = np.where(ok)[0].max()
            beyond = ly[~ok] > ly[last]  # past the last measured column: proportional to y
            fill[beyond] = row[last] * ys[~ok][beyond] / ys[last]
            row[~ok] = fill
    g = np.maximum.accumulate(np.maximum.accumulate(g, axis=0), axis=1)
    return xs, ys, g


def fit_grid(name: str, xv, yv, t, x_label: str, y_label: str) -> Grid:
    xs, ys, g = grid_from_points(xv, yv, t)
    return Grid(name, x_label, y_label, xs, ys, g)


def holdout_errors_1d(x, y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hold out every fourth interior distinct x; returns (x_held, measured, predicted)."""
    s = pd.Series(np.asarray(y, float)).groupby(np.asarray(x, float)).median()
    xs, ys = s.index.to_numpy(float), s.to_numpy(float)
    idx = np.arange(len(xs))
    held = (idx % 4 == 3) & (idx < len(xs) - 1)
    if held.sum() == 0 or (~held).sum() < 2:
        return np.array([]), np.array([]), np.array([])
    c = fit_curve("holdout", xs[~held], ys[~held])
    return xs[held], ys[held], np.asarray(c(xs[held]), float)


def holdout_errors_grid(xv, yv, t) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hold out every fourth interior cell (flattened order); the refit table fills it from its
    row neighbours; predictions are full bilinear evaluations. Returns (cells, measured, pred)."""
    xs, ys, g = grid_from_points(xv, yv, t)
    raw = pd.DataFrame({"x": np.asarray(xv, float), "y": np.asarray(yv, float),
                        "t": np.asarray(t, float)}).pivot_table(
        index="x", columns="y", values="t", aggfunc="median").to_numpy(float)
    nx, ny = g.shape
    flat = np.arange(nx * ny)
    ii, jj = flat // ny, flat % ny
    held = (flat % 4 == 3) & (jj > 0) & (jj < ny - 1) & ~np.isnan(raw[ii, jj])
    pts_x, pts_y, meas = xs[ii[held]], ys[jj[held]], raw[ii[held], jj[held]]
    keep = ~held & ~np.isnan(raw[ii, jj])
    refit = Grid("holdout", "x", "y", *grid_from_points(xs[ii[keep]], ys[jj[keep]],
                                                          raw[ii[keep], jj[keep]]))
    pred = np.array([refit(a, b) for a, b in zip(pts_x, pts_y)])
    return np.stack([pts_x, pts_y], 1), meas, pred
