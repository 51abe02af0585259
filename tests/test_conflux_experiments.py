"""experiments/conflux: the runnable baseline files parse; the full figures wait only for the
sequence-parallel policies."""
from __future__ import annotations

from pathlib import Path

import pytest

from simserve.errors import ConfigError
from simserve.runner.config import load_experiment
from simserve.policies import policy_names

DIR = Path(__file__).resolve().parents[1] / "experiments" / "conflux"
MODELS = {"llama8b": ("llama-3.1-8b", 4, 1000, 50), "qwen14b": ("qwen3-14b", 4, 2000, 100),
          "qwen32b": ("qwen3-32b", 8, 2000, 100)}


@pytest.mark.parametrize("short", sorted(MODELS))
def test_baseline_files_follow_the_paper_setup(short):
    model, gpus, ttft, tbt = MODELS[short]
    cfg = load_experiment(DIR / f"fig12-{short}-baselines.yaml")
    assert (cfg.model, cfg.hardware.num_gpus, cfg.hardware.gpu) == (model, gpus, "h100-sxm")
    assert (cfg.slo.ttft_ms, cfg.slo.tbt_ms) == (ttft, tbt)
    assert cfg.workload.trace == "synthetic-mooncake-toolagent"
    names = {p.name for p in cfg.policies}
    assert names == {"chunked", "muxwise", "distserve"}
    for p in cfg.policies:
        if p.name == "muxwise":
            assert p.config.tbt_ms == tbt
        assert (p.config.scheduler == "srpt") == ("++" in p.label)


@pytest.mark.parametrize("short", sorted(MODELS))
def test_full_figures_need_only_the_sp_policies(short):
    if {"loongserve", "conflux"} <= set(policy_names()):
        load_experiment(DIR / f"fig12-{short}.yaml")
        return
    with pytest.raises(ConfigError, match="loongserve|conflux"):
        load_experiment(DIR / f"fig12-{short}.yaml")
