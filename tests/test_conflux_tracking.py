"""ConfluxServe's estimator-error counters (issue 13 §2): the estimate each prefill dispatch
planned against, beside the iteration time the cost model charged, reach the run's summary."""
from __future__ import annotations

import numpy as np
import pytest

from simserve.hardware.profile import load_profile
from simserve.policies.conflux.tracking import EstimatorTracker
from simserve.run import simulate_point
from simserve.runner.config import parse_experiment
from simserve.runner.point import points, run_point
from tests.helpers import workload
from tests.sp_hand import HW4


def test_tracker_summary_by_hand():
    t = EstimatorTracker(0.11)
    t.add(0.10, 0.10)
    t.add(0.12, 0.10)
    s = t.summary()
    assert s["conflux_num_prefill_iterations"] == 2
    assert s["conflux_estimator_mape"] == pytest.approx((0 + 0.02 / 0.12) / 2)
    assert s["conflux_estimator_bias"] == pytest.approx((0 + 0.2) / 2)
    assert s["conflux_prefill_iter_over_tau_share"] == 0.5
    assert s["conflux_p99_prefill_iter_over_tau"] == pytest.approx((0.10 + 0.99 * 0.02) / 0.11)


def test_tracker_without_prefill_iterations_reports_none():
    s = EstimatorTracker(0.1).summary()
    assert s["conflux_num_prefill_iterations"] == 0 and np.isnan(s["conflux_estimator_mape"])


def _run(**kw):
    """40 decodes, then a backlog of 1K-token prompts packed up to the TBT (100 ms)."""
    w = workload([0.0] * 40 + [2.0] * 60, [1500] * 40 + [1000] * 60, [200] * 40 + [1] * 60)
    return simulate_point(w, "qwen3-14b", HW4, "conflux", scheduler="fcfs", tbt_ms=100.0, **kw)


@pytest.mark.parametrize("estimator", ["paper", "oracle"])
def test_every_prefill_iteration_is_tracked_against_its_dispatch_target(estimator):
    """Iterations that dispatched prefill are tracked, under either estimator, with the margin
    the dispatch used."""
    r = _run(estimator=estimator)
    c = r.stats["counters"]
    n = c["conflux_num_prefill_iterations"]
    assert n > 0 and 0 < c["conflux_estimator_mape"] < 0.5
    assert c["conflux_tbt_margin"] == r.stats["conflux"]["tbt_margin"]


def test_counters_reach_the_summary_and_tell_the_estimators_apart():
    """The paper's estimator (no margin) runs more of its prefill iterations past τ than the
    oracle (calibrated margin) on the same workload."""
    p = _run()
    o = _run(estimator="oracle")
    cp, co = p.stats["counters"], o.stats["counters"]
    assert cp["conflux_prefill_iter_over_tau_share"] > co["conflux_prefill_iter_over_tau_share"]
    assert co["conflux_tbt_margin"] > 0 == cp["conflux_tbt_margin"]
    h100 = load_profile("h100-sxm", "gpu").overheads["sp_contention"]   # the cost model's
    assert (co["conflux_alpha"], co["conflux_beta"]) == (h100["alpha"], h100["beta"])
    assert (cp["conflux_alpha"], cp["conflux_beta"]) != (1.28, 1.28)   # fitted on mixed batches


def test_counters_land_in_the_point_summary():
    cfg = parse_experiment({
        "model": "qwen3-14b", "hardware": {"gpu": "h100-sxm", "num_gpus": 4},
        "workload": {"trace": "random", "random_input_len": 4096, "random_output_len": 64,
                     "num_requests": 40, "rates": [20], "seed": 0},
        "policies": [{"name": "conflux", "tbt_ms": 50}], "slo": {"ttft_ms": 2000, "tbt_ms": 50}})
    s = run_point(cfg, points(cfg)[0]).summary["counters"]
    assert s["conflux_num_prefill_iterations"] > 0
    assert s["conflux_estimator_mape"] > 0 and s["conflux_tbt_margin"] == 0.0
