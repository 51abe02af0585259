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
from simserve.hardware.profile import HardwareProfile, load_profile
from simserve.paths import REPO_ROOT

BAR = {"gpu": 3.0, "cpu": 5.0, "link": 3.0}


def _raw_dir(p: HardwareProfile) -> Path:
    if p.provenance_type != "measured" or not p.provenance.get("raw"):
        raise SimserveError(f"profile {p.name!r} is {p.provenance_type}: nothing measured to "
                            "hold out (check measured profiles, e.g. h200-sxm, xeon-emr, pcie5-x16)")
    d = Path(p.provenance["raw"])
    d = d if d.is_absolute() else REPO_ROOT / d
    if not d.is_dir():
        raise SimserveError(f"profile {p.name!r}: raw folder {d} not found (raw calibration "
                            "points live in the source repository, not in the installed package)")
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
        cpu = raw[(raw.part == "cpu") & (raw.model != "")]
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


def plot_profile(name: str, out_dir: Path, model: str | None = None, tp: int = 1) -> list[Path]:
    """Measured points and fitted tables of a measured profile, one PNG + SVG per figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simserve.calibrate.tables import fit_curve, fit_grid
    from simserve.plots import profile_fit_1d, profile_fit_grid
    p = load_profile(name)
    raw = read_raw(_raw_dir(p))
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, stem):
        for ext in ("png", "svg"):
            path = out_dir / f"{name}-{stem}.{ext}"
            fig.savefig(path, dpi=120, bbox_inches="tight")
            written.append(path)
        plt.close(fig)

    if p.kind == "gpu":
        model = model or "llama-3.1-8b"
        d = raw[raw.part.isin(["gpu_dense", "gpu_elementwise"]) & (raw.model == model) &
                (raw.tp == tp)]
        ops = sorted(d.op.unique())
        fig, axs = plt.subplots(2, (len(ops) + 1) // 2, figsize=(4 * ((len(ops) + 1) // 2), 7))
        for ax, op in zip(axs.ravel(), ops):
            g = d[d.op == op]
            profile_fit_1d(g.tokens, g.median_us, fit_curve(op, g.tokens, g.median_us),
                           f"{op}, {model} TP{tp}", ax=ax)
        fig.suptitle(f"{name}: dense and elementwise ops (one layer, one rank)")
        save(fig, f"dense-{model}-tp{tp}")
        pa = raw[(raw.op == "prefill_attn") & (raw.model == model) & (raw.tp == tp)]
        da = raw[(raw.part == "gpu_decode_attn") & (raw.op == "decode_attn") & (raw.tp == tp)]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
        if not pa.empty:
            profile_fit_grid(pa.chunk, pa.context, pa.median_us,
                             fit_grid("p", pa.chunk, pa.context, pa.median_us, "chunk", "context"),
                             f"prefill attention, {model} TP{tp}", ax=a1, x_label="chunk")
        if not da.empty:
            profile_fit_grid(da.batch, da.context, da.median_us,
                             fit_grid("d", da.batch, da.context, da.median_us, "batch", "context"),
                             f"decode attention (paged), TP{tp}", ax=a2)
        save(fig, f"attention-{model}-tp{tp}")
    elif p.kind == "cpu":
        cpu = raw[raw.part == "cpu"]
        fig, axs = plt.subplots(1, 2, figsize=(12, 4.5))
        for th, g in cpu[cpu.op == "gate_up"].groupby("threads"):
            b = g.groupby("tokens").median_us.min()
            profile_fit_1d(b.index, b.values, fit_curve("g", b.index, b.values),
                           "gate_up on the CPU (fastest implementation per point)", ax=axs[0])
            axs[0].lines[-1].set_label(f"fit, {int(th)} threads")
        da = cpu[cpu.op == "decode_attn"]
        da = da[da.threads == da.threads.max()]
        if not da.empty:
            profile_fit_grid(da.batch, da.context, da.median_us,
                             fit_grid("d", da.batch, da.context, da.median_us, "batch", "context"),
                             f"CPU decode attention, {int(da.threads.max())} threads", ax=axs[1])
        save(fig, "cpu")
    else:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, t in p.tables.items():
            ax.loglog(t["bytes"], t["us"], "o-", ms=3, label=key)
        ax.set_xlabel("bytes")
        ax.set_ylabel("time (µs)")
        ax.set_title(f"{name}: copies and collectives")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "link")
    return written
