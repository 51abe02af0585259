"""`realcheck.tail_causes`: what the real engine's own logs say about a run's tails, measured
without simserve's model. Skipped where the measured data is absent."""
from __future__ import annotations

import os

import numpy as np
import pytest

from simserve.realcheck.serve_score import ROOT
from simserve.realcheck.tail_causes import run_causes, tokenizer_groups


def test_tokenisations_ending_together_form_one_group():
    ends = np.array([0.0, 0.0001, 0.0002, 0.010, 0.020, 0.0201])
    assert tokenizer_groups(ends) == [3, 1, 2]
    assert tokenizer_groups(np.array([])) == []


def _run(name: str) -> str:
    d = os.path.join(ROOT, name)
    if not os.path.exists(os.path.join(d, "run.json")):
        pytest.skip(f"{d}: measured run not present")
    return d


def test_the_first_plan_after_a_server_start_stalls_once():
    """The first decode step of the first plan on a fresh server took ~0.5 s; a later plan's
    first decode steps take what its others do."""
    first = run_causes(_run("llama-default/llama-3.1-8b-random-r6.2"), ROOT)
    later = run_causes(_run("llama-default/llama-3.1-8b-random-r15.5"), ROOT)
    assert first["stall_ms"] > 50 * first["median_step_ms"]
    assert later["stall_ms"] < 10 * later["median_step_ms"]


def test_a_burst_reaches_the_engine_in_tokenizer_batches():
    """The API server tokenises concurrent prompts together (up to 32 at a time), a paced
    run's one by one."""
    burst = run_causes(_run("qwen-rerun/qwen3-14b-short-rinf"), ROOT)
    paced = run_causes(_run("llama-default/llama-3.1-8b-conv-r4.7"), ROOT)
    assert burst["batched_pct"] > 90 and burst["max_group"] == 32
    assert paced["batched_pct"] < 15 and paced["max_group"] <= 2
