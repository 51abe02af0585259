"""`simserve profiles check NAME`: hold out every fourth measured point, refit, report errors.

Per op family (pooled over the models and TP degrees measured): the number of held-out
points, their mean absolute percentage error (MAPE), the worst error and where it was, and
the bar it is held to (GPU dense and attention ops 3 %, CPU ops 5 %).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simserve.calibrate.tables import holdout_errors_1d, holdout_errors_grid, read_raw
from simserve.errors import SimserveError
from simserve.hardware.profile import REPO_ROOT, HardwareProfile, load_profile

BAR = {"gpu": 3.0, "cpu": 5.0, "link": 3.0}


def _raw_dir(p: HardwareProfile) -> Path:
    if p.provenance_type != "measured" or not p.provenance.get("raw"):
        raise SimserveError(f"profile {p.name!r} is {p.provenance_type}: nothing measured to "
                            "hold out (check measured profiles, e.g. h200-sxm, xeon-emr, pcie5-x16)")
    d = Path(p.provenance["raw"])
    d = d if d.is_absolute() else REPO_ROOT / d
    if not d.is_dir():
        raise SimserveError(f"profile {p.name!r}: raw folder {d} not found")
    return d


def _rows(family, groups, fn) -> list[dict]:
    rows = []
    for key, d in groups:
        where, meas, pred = fn(d)
        if len(meas) == 0:
            continue
        err = np.abs(pred - meas) / meas * 100.0
        for w, e in zip(where, err):
            rows.append({"op": family, "config": key, "point": w, "err_pct": float(e)})
    return rows


def _one_d(x, y):
    return lambda d: holdout_errors_1d(d[x], d["median_us"])


def check_errors(p: HardwareProfile) -> pd.DataFrame:
    """One row per held-out point: op family, configuration, coordinates, % error."""
    raw = read_raw(_raw_dir(p))
    rows: list[dict] = []
    if p.kind == "gpu":
        dense = raw[raw.part.isin(["gpu_dense", "gpu_elementwise"])]
        for op, d in dense.groupby("op"):
            rows += _rows(op, d.groupby(["model", "tp"]), _one_d("tokens", "median_us"))
        pa = raw[(raw.part == "gpu_prefill_attn") & (raw.op == "prefill_attn")]
        rows += _rows("prefill_attn", pa.groupby(["model", "tp"]),
                      lambda d: holdout_errors_grid(d.chunk, d.context, d.median_us))
        da = raw[(raw.part == "gpu_decode_attn") & (raw.op == "decode_attn")]
        rows += _rows("decode_attn", da.groupby(["model", "tp"]),
                      lambda d: holdout_errors_grid(d.batch, d.context, d.median_us))
    elif p.kind == "cpu":
        cpu = raw[raw.part == "cpu"]
        best = cpu.groupby(["model", "threads", "op", "tokens", "batch", "context"],
                           dropna=False).median_us.min().reset_index()
        for op, d in best[best.op != "decode_attn"].groupby("op"):
            rows += _rows(op, d.groupby(["model", "threads"]), _one_d("tokens", "median_us"))
        da = best[best.op == "decode_attn"]
        rows += _rows("decode_attn", da.groupby(["model", "threads"]),
                      lambda d: holdout_errors_grid(d.batch, d.context, d.median_us))
    else:
        ln = raw[(raw.part == "links") & raw.op.str.endswith("pinned") & (raw.timer == "cuda_events")]
        rows += _rows("copy_pinned", ln.groupby("op"), _one_d("bytes", "median_us"))
        col = raw[(raw.part == "collectives") &
                  ~raw.impl.str.contains("second pass|host-bound|graph|both ways|batch_isend")]
        for op, d in col.groupby("op"):
            rows += _rows(op, d.groupby("impl"), _one_d("bytes", "median_us"))
    return pd.DataFrame(rows)


def _fmt(v) -> str:
    if isinstance(v, (tuple, list, np.ndarray)):
        return "/".join(_fmt(x) for x in v)
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def summary(p: HardwareProfile, errs: pd.DataFrame) -> pd.DataFrame:
    bar = BAR[p.kind]
    out = []
    for op, d in errs.groupby("op", sort=False):
        w = d.loc[d.err_pct.idxmax()]
        out.append({"op": op, "held_out": len(d), "mape_pct": d.err_pct.mean(),
                    "worst_pct": w.err_pct, "worst_at": f"{_fmt(w.config)} at {_fmt(w.point)}",
                    "bar_pct": bar, "ok": d.err_pct.mean() <= bar})
    return pd.DataFrame(out)


def format_summary(name: str, s: pd.DataFrame) -> str:
    lines = [f"{name}: every fourth measured point held out, tables refitted without it",
             f"{'op':16} {'held':>5} {'MAPE %':>7} {'worst %':>8} {'bar %':>6}  ok   worst at"]
    for r in s.itertuples():
        lines.append(f"{r.op:16} {r.held_out:5d} {r.mape_pct:7.2f} {r.worst_pct:8.1f} "
                     f"{r.bar_pct:6.1f}  {'yes' if r.ok else 'NO ':3}  {r.worst_at}")
    return "\n".join(lines)


def run_check(name: str) -> tuple[str, bool]:
    p = load_profile(name)
    s = summary(p, check_errors(p))
    return format_summary(name, s), bool(s.ok.all())
