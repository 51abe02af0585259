"""Fit the spatial-sharing curves of a GPU from `simserve.calibrate.smshare` runs (no torch).

    python -m simserve.calibrate.smshare_fit hwprofiles/raw/h200-sxm/smshare

Reads every RUN/smshare.csv (+ meta.json) under the folder and writes smshare.json beside the
runs: piecewise-linear functions of the SM fraction f = SMs / device SMs,
- `bw_fraction`: the share of whole-GPU throughput a memory-bound pass (decode) keeps on f of
  the SMs (median over decode batches and models);
- `compute_fraction`: the same for compute-bound passes (prefill chunks): above f where fewer
  SMs run at higher clocks and with less wave quantisation;
- `decode_contention`, `prefill_contention` at the decode partition's fraction: co-running
  slowdowns alpha and beta of decode and prefill on disjoint partitions;
and the check of `SmShareCost` (the model MuxWise is priced with) against every partition
timing: MAPE with the analytic defaults (HBM saturating at half the SMs, compute ∝ f, alpha =
beta = 1.28) and with these curves, in sample and fitted on the other models only.
`simserve calibrate fit` copies the curves into the profile's `overheads.sm_share`.
"""
from __future__ import annotations

import argparse
import json
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
        d["run"] = csv.parent.name
        frames.append(d)
    if not frames:
        raise FileNotFoundError(f"{root}: no */smshare.csv with meta.json")
    return pd.concat(frames, ignore_index=True)


def _monotone(f: np.ndarray, v: np.ndarray) -> tuple[list, list]:
    o = np.argsort(f)
    f, v = np.append(f[o], 1.0), np.minimum(np.maximum.accumulate(np.append(v[o], 1.0)), 1.0)
    return [round(float(x), 4) for x in f], [round(float(x), 4) for x in v]


def curves(df: pd.DataFrame) -> dict:
    """The curves of one set of rows (see the module docstring)."""
    total = int(df.total.iloc[0])
    dec = df[(df.kind == "decode_alone") & (df.decode_sms < total)]
    pre = df[(df.kind == "prefill_alone") & (df.prefill_sms < total)]
    bw = (1.0 / dec.ratio).groupby(dec.decode_sms).median()
    cf = (1.0 / pre.ratio).groupby(pre.prefill_sms).median()
    # one knot set: the partition sizes measured for both
    s = np.array(sorted(set(bw.index) & set(cf.index)), dtype=float)
    f, bwv = _monotone(s / total, bw.loc[s].to_numpy())
    _, cfv = _monotone(s / total, cf.loc[s].to_numpy())
    co_d = df[df.kind == "corun_decode"].groupby("decode_sms").ratio.median()
    co_p = df[df.kind == "corun_prefill"].groupby("decode_sms").ratio.median()
    s2 = np.array(sorted(set(co_d.index) & set(co_p.index)), dtype=float)
    return {"sm_fraction": f, "bw_fraction": bwv, "compute_fraction": cfv,
            "corun_decode_fraction": [round(float(x), 4) for x in s2 / total],
            "decode_contention": [round(float(x), 4) for x in co_d.loc[s2]],
            "prefill_contention": [round(float(x), 4) for x in co_p.loc[s2]]}


def _predict(df: pd.DataFrame, sm_share: dict | None) -> pd.DataFrame:
    """SmShareCost's time ratios (partition / whole GPU) and co-run slowdowns for the rows, on
    the measured h200-sxm profile, without the TP all-reduces (not in the measurement)."""
    from simserve.hardware.setup import HardwareConfig, resolve_hardware
    from simserve.models import get_model
    from simserve.cost import GpuCostModel
    from simserve.policies.muxwise.smshare import SmShareCost, contention
    out = []
    for (model, shard), g in df.groupby(["model", "shard"]):
        hw = resolve_hardware(HardwareConfig(gpu="h200-sxm", num_gpus=int(shard)))
        cost = GpuCostModel(get_model(model), hw.gpu, int(shard),
                            hw.nvlink if shard > 1 else None)
        sc = SmShareCost(cost, 0.5, curves=sm_share)
        total = int(g.total.iloc[0])
        for r in g.itertuples():
            if r.kind == "decode_alone" and r.decode_sms < total:
                f = r.decode_sms / total
                p = sc.decode_layer_us(int(r.decode_batch), int(r.decode_batch * r.decode_ctx), f,
                                       int(r.decode_ctx), allreduce=False) / \
                    sc.decode_layer_us(int(r.decode_batch), int(r.decode_batch * r.decode_ctx), 1.0,
                                       int(r.decode_ctx), allreduce=False)
            elif r.kind == "prefill_alone" and r.prefill_sms < total:
                f = r.prefill_sms / total
                p = sc.prefill_layer_us(int(r.prefill_chunk), int(r.prefill_ctx), f, allreduce=False) / \
                    sc.prefill_layer_us(int(r.prefill_chunk), int(r.prefill_ctx), 1.0, allreduce=False)
            elif r.kind in ("corun_decode", "corun_prefill"):
                a, b = contention(sm_share, r.decode_sms / total)
                p = a if r.kind == "corun_decode" else b
            else:
                continue
            out.append({"run": r.run, "model": model, "kind": r.kind, "measured": r.ratio,
                        "predicted": p})
    return pd.DataFrame(out)


def _mape(p: pd.DataFrame) -> dict:
    e = (p.predicted / p.measured - 1.0).abs() * 100
    return {k: round(float(e[p.kind == k].mean()), 2) for k in
            ("decode_alone", "prefill_alone", "corun_decode", "corun_prefill")}


def fit(root: Path) -> dict:
    df = load(root)
    res = curves(df)
    models = sorted(df.model.unique())
    res["mape_pct"] = {"analytic defaults": _mape(_predict(df, None)),
                       "measured curves, in sample": _mape(_predict(df, res))}
    lomo = []
    for m in models:
        lomo.append(_predict(df[df.model == m], curves(df[df.model != m])))
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
    res = fit(root)
    (root / "smshare.json").write_text(json.dumps(res, indent=1) + "\n")
    for k, v in res["mape_pct"].items():
        print(f"{k:45s} " + "  ".join(f"{n} {x:5.2f}%" for n, x in v.items()))
    print(f"wrote {root / 'smshare.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
