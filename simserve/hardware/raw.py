"""The raw calibration points behind a measured profile (`hwprofiles/raw/NAME/*.csv`), read
without torch: `calibrate` fits them, `rescale` takes measured ceilings from them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def read_raw(folder: str | Path) -> pd.DataFrame:
    """Every CSV of one raw folder in one frame (shared schema; blank cells are NaN)."""
    folder = Path(folder)
    files = sorted(folder.glob("*.csv"))
    if not files:
        raise FileNotFoundError(f"{folder}: no raw calibration CSVs")
    frames = [pd.read_csv(f).assign(file=f.name) for f in files]
    df = pd.concat(frames, ignore_index=True)
    for col in ("part", "model", "op", "impl", "timer", "note"):  # text columns of the schema
        df[col] = df[col].fillna("").astype(str) if col in df else ""
    for col in ("tp", "tokens", "batch", "context", "context_sum", "chunk", "bytes", "flops",
                "threads", "median_us"):
        if col not in df:
            df[col] = np.nan
    return df
