"""The committed real-executor measurements (validation/) re-scored with the committed
profiles: the issue's bar (GPU iteration MAPE <= 5 %) guards every change to the cost model or
the profiles against the hardware we measured."""
from pathlib import Path

import pytest

from simserve.validate.report import score_gpu
from simserve.validate.score import summary

ROOT = Path(__file__).resolve().parents[1] / "validation"
RUNS = [("h200-sxm-llama-3.1-8b", "llama-3.1-8b"), ("h200-sxm-llama-3.1-8b-run2", "llama-3.1-8b"),
        ("h200-sxm-qwen3-14b", "qwen3-14b")]


@pytest.mark.parametrize("folder,model", RUNS)
def test_gpu_iterations_stay_within_the_bar(folder, model):
    df = score_gpu(str(ROOT / folder / "gpu_iterations.csv"), "h200-sxm", model)
    assert len(df) >= 100
    s = summary(df, "predicted_graph_us", "graph_us")
    assert s["all"]["mape_pct"] <= 5.0
    for kind in ("prefill", "decode", "mixed"):
        assert s[kind]["mape_pct"] <= 6.0, kind
