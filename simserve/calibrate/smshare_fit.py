"""Fit the spatial-sharing curves of a GPU from `simserve.calibrate.smshare` runs (no torch).

    python -m simserve.calibrate.smshare_fit hwprofiles/raw/h200-sxm/smshare

Reads every RUN/smshare.csv (+ meta.json) under the folder and writes smshare.json beside the
runs: piecewise-linear functions of the SM fraction f = SMs / device SMs,
- `bw_fraction`, `compute_fraction`: the shares of whole-GPU memory and compute throughput
  that f of the SMs deliver, fitted per measured partition size so that `SmShareCost` (which
  splits every kernel into compute- and memory-bound roofline parts) best predicts the decode
  and prefill passes timed alone there. Compute runs above f on small partitions (higher
  clocks, less wave quantisation);
- `decode_contention`, `prefill_contention` at the decode partition's fraction: co-running
  slowdowns alpha and beta of decode and prefill on disjoint partitions (medians; from the
  full-depth runs where there are any: a whole-model prefill of 70-180 ms beside decodes slows
  both more than 4-layer passes of a few ms do, 1.21 / 1.11 against 1.16 / 1.07);
and the check of `SmShareCost` (the model MuxWise is priced with) against every partition
timing: MAPE with the analytic defaults (HBM saturating at half the SMs, compute ∝ f, alpha =
beta = 1.28) and with these curves, in sample and fitted on the other models only.
`simserve calibrate fit` copies the curves into the profile's `overheads.sm_share`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

KEYS = ("sm_fraction", "bw_fraction", "compute_fraction")


def load(root: Path) -> pd.DataFrame:
    """All runs' rows, with the run's model, shard and device SM count."""
    frames = []
    for csv in sorted(root.glob("*/smshare.csv")):
        meta = json.loads((csv.parent / "meta.json").read_text())
        d = pd.read_csv(csv)
        if not d.note.fillna("").str.contains("prefill and").any():
            continue  # the first protocol (one prefill pass per co-run): a repeatability check
        d["model"], d["shard"], d["total"] = meta["model"], meta["shard"], meta["device_sms"]
        d["full_depth"] = not meta["layers"]  # --layers 0: every layer of the model
        d["run"] = csv.parent.name
        frames.append(d)
    if not frames:
        raise FileNotFoundError(f"{root}: no */smshare.csv with meta.json")
    return pd.concat(frames, ignore_index=True)


def _monotone(v) -> list:
    return [round(float(x), 4) for x in np.minimum(np.maximum.accumulate(np.asarray(v)), 1.0)]


class _Costs:
    """`SmShareCost` per (model, TP shard) on the measured h200-sxm profile, and its time ratio
    (share f / whole GPU) for a measured row, without the TP all-reduces (not measured)."""

    def __init__(self):
        self._sc, self._full = {}, {}

    def get(self, model: str, shard: int):
        if (model, shard) not in self._sc:
            from simserve.cost import GpuCostModel
            from simserve.hardware.setup import HardwareConfig, resolve_hardware
            from simserve.models import get_model
            from simserve.cost.smshare import SmShareCost
            hw = resolve_hardware(HardwareConfig(gpu="h200-sxm", num_gpus=int(shard)))
            cost = GpuCostModel(get_model(model), hw.gpu, int(shard),
                                hw.nvlink if shard > 1 else None)
            self._sc[model, shard] = SmShareCost(cost, 0.5)
        return self._sc[model, shard]

    def layer_us(self, r, f: float, curves: dict | None) -> float:
        sc = self.get(r.model, int(r.shard))
        sc.use_curves(curves)
        if r.kind == "decode_alone":
            b, c = int(r.decode_batch), int(r.decode_ctx)
            return sc.decode_layer_us(b, b * c, f, c, allreduce=False)
        return sc.prefill_layer_us(int(r.prefill_chunk), int(r.prefill_ctx), f, allreduce=False)

    def ratio(self, r, f: float, curves: dict | None) -> float:
        key = (r.model, r.shard, r.kind) + tuple(  # NaN (not this kind's column) as None
            None if pd.isna(v) else v
            for v in (r.decode_batch, r.decode_ctx, r.prefill_chunk, r.prefill_ctx))
        if key not in self._full:
            self._full[key] = self.layer_us(r, 1.0, None)
        return self.layer_us(r, f, curves) / self._full[key]


def _alone(df: pd.DataFrame, total: int) -> pd.DataFrame:
    d = df.assign(sms=np.where(df.kind == "decode_alone", df.decode_sms, df.prefill_sms))
    return d[d.kind.isin(["decode_alone", "prefill_alone"]) & (d.sms < total)]


def _corun(df: pd.DataFrame) -> pd.DataFrame:
    """The co-run rows the slowdowns come from: the full-depth runs' where there are any
    (sustained co-running slows both more than 4-layer bursts do)."""
    co = df[df.kind.isin(["corun_decode", "corun_prefill"])]
    return co[co.full_depth] if co.full_depth.any() else co


def curves(df: pd.DataFrame, costs: _Costs | None = None) -> dict:
    """The curves of one set of rows (see the module docstring). At each partition size where
    both decode and prefill ran alone, the memory and compute shares (bw, c) are the ones with
    which `SmShareCost` best predicts those rows' time ratios (least squares in log ratio):
    the cost model splits every kernel into its compute- and memory-bound roofline parts, so
    a decode batch whose GEMMs are compute-bound (hundreds of rows) informs c, not bw."""
    from scipy.optimize import minimize
    costs = costs or _Costs()
    total = int(df.total.iloc[0])
    al = _alone(df, total)
    both = sorted(set(al.sms[al.kind == "decode_alone"]) & set(al.sms[al.kind == "prefill_alone"]))
    bws, cfs = [], []
    for s in both:
        f = s / total
        rows = list(al[al.sms == s].itertuples())
        meas = np.log([r.ratio for r in rows])

        def loss(x, rows=rows, f=f, meas=meas):
            c = {"sm_fraction": [f, 1.0], "bw_fraction": [float(np.exp(x[0])), 1.0],
                 "compute_fraction": [float(np.exp(x[1])), 1.0]}
            return float(np.sum((np.log([costs.ratio(r, f, c) for r in rows]) - meas) ** 2))
        dec = al[(al.sms == s) & (al.kind == "decode_alone")]
        x0 = np.log([min(1.0, float((1.0 / dec.ratio).median())), f])
        x = minimize(loss, x0, method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-6}).x
        bws.append(float(np.exp(x[0])))
        cfs.append(float(np.exp(x[1])))
    co = _corun(df)
    co_d = co[co.kind == "corun_decode"].groupby("decode_sms").ratio.median()
    co_p = co[co.kind == "corun_prefill"].groupby("decode_sms").ratio.median()
    s2 = np.array(sorted(set(co_d.index) & set(co_p.index)), dtype=float)
    return {"sm_fraction": [round(float(x), 4) for x in [*(np.array(both) / total), 1.0]],
            "bw_fraction": _monotone([*bws, 1.0]), "compute_fraction": _monotone([*cfs, 1.0]),
            "corun_decode_fraction": [round(float(x), 4) for x in s2 / total],
            "decode_contention": [round(float(x), 4) for x in co_d.loc[s2]],
            "prefill_contention": [round(float(x), 4) for x in co_p.loc[s2]]}


def _predict(df: pd.DataFrame, sm_share: dict | None, costs: _Costs) -> pd.DataFrame:
    """`SmShareCost`'s time ratios (partition / whole GPU) and co-run slowdowns for the rows,
    on the measured h200-sxm profile, without the TP all-reduces (not in the measurement)."""
    from simserve.cost.smshare import contention
    total = int(df.total.iloc[0])
    out = []
    for r in _alone(df, total).itertuples():
        out.append({"model": r.model, "kind": r.kind, "measured": r.ratio,
                    "predicted": costs.ratio(r, r.sms / total, sm_share)})
    for r in _corun(df).itertuples():
        a, b = contention(sm_share, r.decode_sms / total)
        out.append({"model": r.model, "kind": r.kind, "measured": r.ratio,
                    "predicted": a if r.kind == "corun_decode" else b})
    return pd.DataFrame(out)


def _mape(p: pd.DataFrame) -> dict:
    e = (p.predicted / p.measured - 1.0).abs() * 100
    return {k: round(float(e[p.kind == k].mean()), 2) for k in
            ("decode_alone", "prefill_alone", "corun_decode", "corun_prefill")}


def fit(root: Path) -> dict:
    df = load(root)
    costs = _Costs()
    res = curves(df, costs)
    models = sorted(df.model.unique())
    res["mape_pct"] = {"analytic defaults": _mape(_predict(df, None, costs)),
                       "measured curves, in sample": _mape(_predict(df, res, costs))}
    lomo = []
    for m in models:
        lomo.append(_predict(df[df.model == m], curves(df[df.model != m], costs), costs))
    res["mape_pct"]["measured curves, fitted on the other models"] = _mape(pd.concat(lomo))
    runs = ", ".join(f"{r} ({m}, TP{s} shapes)" for r, m, s in
                     df[["run", "model", "shard"]].drop_duplicates().itertuples(index=False))
    res["source"] = (f"simserve.calibrate.smshare on {df.total.iloc[0]}-SM green-context "
                     f"partitions of one GPU: {runs}")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="folder of smshare runs (RUN/smshare.csv)")
    a = ap.parse_args(argv)
    root = Path(a.root)
    try:
        res = fit(root)
    except FileNotFoundError as exc:
        print(f"smshare_fit: error: {exc}", file=sys.stderr)
        return 2
    (root / "smshare.json").write_text(json.dumps(res, indent=1) + "\n")
    for k, v in res["mape_pct"].items():
        print(f"{k:45s} " + "  ".join(f"{n} {x:5.2f}%" for n, x in v.items()))
    print(f"wrote {root / 'smshare.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
