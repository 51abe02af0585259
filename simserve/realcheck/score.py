"""Error statistics of predicted vs measured iteration times."""
from __future__ import annotations

import numpy as np
import pandas as pd


def ape(pred, meas) -> np.ndarray:
    pred, meas = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    return np.abs(pred - meas) / meas * 100.0


def summary(df: pd.DataFrame, pred: str = "predicted_us", meas: str = "measured_us",
            by: str | None = "kind") -> dict:
    """MAPE, P50/P90 absolute percentage error, mean signed error and worst case, overall and
    per group."""
    def one(d):
        e = ape(d[pred], d[meas])
        signed = (d[pred].to_numpy() - d[meas].to_numpy()) / d[meas].to_numpy() * 100
        return {"n": int(len(d)), "mape_pct": float(e.mean()), "p50_ape_pct": float(np.median(e)),
                "p90_ape_pct": float(np.percentile(e, 90)), "max_ape_pct": float(e.max()),
                "mean_signed_pct": float(signed.mean())}
    out = {"all": one(df)}
    if by and by in df:
        for k, d in df.groupby(by):
            out[str(k)] = one(d)
    return out


def worst(df: pd.DataFrame, n: int = 5, pred: str = "predicted_us",
          meas: str = "measured_us") -> pd.DataFrame:
    d = df.assign(ape_pct=ape(df[pred], df[meas]))
    return d.sort_values("ape_pct", ascending=False).head(n)
