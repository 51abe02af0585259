"""The committed real-executor measurements (validation/) re-scored with the committed
profiles: the issue's bar (GPU iteration MAPE <= 5 %) guards every change to the cost model or
the profiles against the hardware we measured."""
from pathlib import Path

import pytest

from simserve.realcheck.report import score_gpu
from simserve.realcheck.score import summary

ROOT = Path(__file__).resolve().parents[1] / "validation"
RUNS = [("h200-sxm-llama-3.1-8b", "llama-3.1-8b", 1), ("h200-sxm-llama-3.1-8b-run2", "llama-3.1-8b", 1),
        ("h200-sxm-qwen3-14b", "qwen3-14b", 1), ("h200-sxm-x2-tp2-llama-3.1-8b", "llama-3.1-8b", 2),
        ("h200-sxm-x2-tp2-qwen3-14b", "qwen3-14b", 2)]
SP_RUNS = [("h200-sxm-x2-sp2-qwen3-14b", "qwen3-14b"), ("h200-sxm-x2-sp2-llama-3.1-8b", "llama-3.1-8b"),
           ("h200-sxm-x2-sp2-qwen3-14b-run2", "qwen3-14b")]


@pytest.mark.parametrize("folder,model,tp", RUNS)
def test_gpu_iterations_stay_within_the_bar(folder, model, tp):
    df = score_gpu(str(ROOT / folder / "gpu_iterations.csv"), "h200-sxm", model, tp=tp)
    assert len(df) >= 100
    s = summary(df, "predicted_graph_us", "graph_us")
    assert s["all"]["mape_pct"] <= 5.0
    for kind in ("prefill", "decode", "mixed"):
        assert s[kind]["mape_pct"] <= 6.0, kind


@pytest.mark.parametrize("folder,model", SP_RUNS)
def test_conflux_parallelism_iterations_stay_within_the_bar(folder, model):
    """SP2 iterations on two H200s, predicted with the profile's measured contention."""
    import numpy as np
    import pandas as pd

    from simserve.hardware.profile import load_profile
    from simserve.realcheck.sp_batches import from_row, predict_sp
    from simserve.realcheck.sp_score import load, models
    c = load_profile("h200-sxm", "gpu").overheads["sp_contention"]
    cost, est = models(model, "h200-sxm", "nvlink4", 2, c["alpha"], c["beta"])
    df = load(str(ROOT / folder))
    assert len(df) >= 50
    pred = np.array([predict_sp(cost, est, from_row(r))["predicted_us"]
                     for r in df.to_dict("records")])
    s = summary(pd.DataFrame({"p": pred, "m": df["measured_us"], "kind": df["kind"]}), "p", "m")
    assert s["all"]["mape_pct"] <= 5.0
