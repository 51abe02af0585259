"""`simserve.realcheck.step_diff` on committed real-vLLM runs: locked to the real engine's
steps, simserve's scheduler schedules the same requests with the same tokens at every step,
and the cost model prices the real mixed and decode steps within the errors measured when
this test was written. Skipped where the measured data is absent."""
from __future__ import annotations

import os

import pytest

from simserve.realcheck.serve_score import ROOT

RUNS = {  # run: (first divergent step or None, most mean |GPU error| % of mixed, of decode)
    "llama-default/llama-3.1-8b-code-r3.1": (None, 9.0, 2.0),
    "qwen-rerun/qwen3-14b-short-r50": (None, 6.0, 3.5),
    "llama-default/llama-3.1-8b-code-r15.6": (None, 6.0, 2.5),
    "llama-default/llama-3.1-8b-random-rinf": (None, 4.0, 2.0),
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_replay_locked_to_the_real_steps(run):
    d = os.path.join(ROOT, run)
    if not os.path.exists(os.path.join(d, "run.json")):
        pytest.skip(f"{d}: measured run not present")
    from simserve.realcheck.step_diff import diff_run
    rep = diff_run(d, "engine")
    div, mixed, decode = RUNS[run]
    fd = rep["first_divergence"]
    got = None if fd is None else fd["step"]
    # the divergence may only move later (or vanish), never earlier
    assert got is None or (div is not None and got >= div), rep["first_divergence"]
    assert rep["steps"]["sim"] == rep["steps"]["real"] or div is not None
    st = rep["step_time"]
    assert st["mixed"]["gpu"]["mean_abs_pct"] <= mixed
    assert st["decode"]["gpu"]["mean_abs_pct"] <= decode


def test_the_real_log_joins_the_plan():
    d = os.path.join(ROOT, "llama-default/llama-3.1-8b-code-r3.1")
    if not os.path.exists(os.path.join(d, "run.json")):
        pytest.skip("measured run not present")
    from simserve.realcheck.serve_data import load_run
    from simserve.realcheck.step_diff import real_steps
    run = load_run(d, os.path.join(ROOT, "plans"))
    steps, queued = real_steps(run, os.path.dirname(d), True)
    seen = {i for s in steps for i in s.reqs}
    assert seen == set(range(len(run.send)))        # every request of the run, no other
    assert all(s.prompt[i] == run.prompt[i] for s in steps for i in s.reqs)
    assert (queued >= run.send).all()               # vLLM queued each after the client sent it


def test_cli_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    from simserve.realcheck.step_diff import main
    assert main([str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().out
