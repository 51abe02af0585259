"""Score stored validation measurements against the cost model (torch-free).

GPU iterations are predicted in the executor's launch mode: "graph" by a cost model that
graphs every iteration (`graph_max_tokens` covering all batches), "eager" by the eager launch
model (`cuda_graphs=False`). Both exclude the scheduler's assumed host overhead (the executor
has no scheduler). CPU iterations are predicted stage by stage for the executor's layer count.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd

from simserve.cost import GpuCostModel
from simserve.hardware.profile import load_profile
from simserve.models import get_model
from simserve.realcheck import batches as vb
from simserve.realcheck.fit import cpu_predictions
from simserve.realcheck.score import summary, worst
from simserve.realcheck.store import load_gpu_points

ALL_GRAPHED = 1 << 30


def score_gpu(points_csv: str, profile: str, model: str, mixed_attention: str = "split",
              tp: int = 1, link: str = "nvlink4") -> pd.DataFrame:
    spec, prof = get_model(model), load_profile(profile, expect_kind="gpu")
    nv = load_profile(link, expect_kind="link") if tp > 1 else None
    graph = GpuCostModel(spec, prof, tp, nv, mixed_attention=mixed_attention,
                         graph_max_tokens=ALL_GRAPHED)
    eager = GpuCostModel(spec, prof, tp, nv, cuda_graphs=False, mixed_attention=mixed_attention)
    rows = []
    for p in load_gpu_points(points_csv):
        rows.append({"i": p["i"], "kind": p["kind"], "batch": vb.describe(p),
                     "num_tokens": sum(p["chunks"]) + len(p["decode_ctx"]),
                     "graph_us": p["graph_us"], "queued_us": p["queued_us"],
                     "eager_us": p["eager_us"],
                     "predicted_graph_us": vb.predict_gpu_us(graph, p),
                     "predicted_eager_us": vb.predict_gpu_us(eager, p)})
    return pd.DataFrame(rows)


def score_cpu(points_csv: str, profile: str, model: str) -> pd.DataFrame:
    df = pd.read_csv(points_csv)
    return df.assign(predicted_us=cpu_predictions(df, load_profile(profile, expect_kind="cpu"),
                                                  model))


def report(val_dir: str, gpu_profile: str, cpu_profile: str, model: str, tp: int = 1,
           link: str = "nvlink4", out_dir: str | None = None) -> dict:
    """Scores every stored measurement in `val_dir`; with `out_dir`, writes the scored CSVs and
    summary.json there (nothing is written otherwise: `val_dir` may be committed data). GPU
    iterations measured at TP `tp` are predicted at that TP with `link`'s all-reduce."""
    out = {"gpu_profile": gpu_profile, "cpu_profile": cpu_profile, "model": model, "tp": tp}
    g = os.path.join(val_dir, "gpu_iterations.csv")
    if os.path.exists(g):
        df = score_gpu(g, gpu_profile, model, tp=tp, link=link)
        if out_dir:
            df.to_csv(os.path.join(out_dir, "gpu_scored.csv"), index=False)
        out["gpu_graph"] = summary(df, "predicted_graph_us", "graph_us")
        e = df[np.isfinite(df.eager_us)]
        if len(e):
            out["gpu_eager"] = summary(e, "predicted_eager_us", "eager_us")
        out["gpu_queued_vs_graph"] = summary(df, "queued_us", "graph_us")
        out["gpu_graph_worst"] = worst(df, 5, "predicted_graph_us", "graph_us")[
            ["i", "kind", "batch", "graph_us", "predicted_graph_us", "ape_pct"]].to_dict("records")
    c = os.path.join(val_dir, "cpu_iterations.csv")
    if os.path.exists(c):
        df = score_cpu(c, cpu_profile, model)
        if out_dir:
            df.to_csv(os.path.join(out_dir, "cpu_scored.csv"), index=False)
        out["cpu"] = summary(df, by=None)
        out["cpu_worst"] = worst(df, 5)[["i", "batch", "context", "measured_us", "predicted_us",
                                         "ape_pct"]].to_dict("records")
    r = os.path.join(val_dir, "replay.json")
    if os.path.exists(r):
        with open(r) as f:
            out["replay"] = json.load(f).get("comparison")
    if out_dir:
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(out, f, indent=1, default=float)
    return out
