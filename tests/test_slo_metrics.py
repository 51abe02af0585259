"""ConfluxServe's per-token deadlines, per-request attainment and goodput on hand timelines."""
from __future__ import annotations

import math

import numpy as np
import pytest

from simserve.capacity import grid_capacity, parse_target
from simserve.metrics import SLO, max_rate_meeting, request_slo, summarize, token_deadlines_s
from simserve.sim.records import RequestRecords

NAN = math.nan
# TTFT 1 s, TBT 62.5 ms (exact in binary, so on-deadline tokens compare exactly)
SLO_ = SLO(ttft_ms=1000.0, tbt_ms=62.5)


def _records(arrivals, timelines):
    n_out = np.array([len(t) for t in timelines], dtype=np.int64)
    off = np.concatenate(([0], np.cumsum(n_out)))
    flat = np.array([x for t in timelines for x in t], dtype=np.float64)
    first = np.array([t[0] for t in timelines], dtype=np.float64)
    fin = np.array([t[-1] for t in timelines], dtype=np.float64)
    return RequestRecords(np.asarray(arrivals, dtype=np.float64), np.full(len(n_out), 100),
                          n_out, first, fin, off, flat, np.zeros(len(n_out), dtype=np.int64))


TIMELINES = [
    (0.0, [0.9, 0.95, 1.05]),          # all early: deadlines 1.0, 1.0625, 1.125
    (1.0, [1.5, 2.2, 2.21]),           # tokens 2 and 3 late (deadlines 2.0625, 2.125)
    (0.0, [0.1, 0.15, 1.0]),           # an 850 ms stall, paid for by banked slack: met
    (0.0, [1.0, 1.0625, 1.125]),       # exactly on every deadline: met
    (2.0, [2.5, 3.2]),                 # TTFT fine, token 2 due 3.0625: missed
    (0.0, [0.5, NAN]),                 # never finished: missed, the missing token is late
]


def test_deadlines_are_ttft_plus_k_minus_one_tbts():
    rec = _records(*zip(*TIMELINES))
    d = token_deadlines_s(rec, SLO_)
    assert d[:3].tolist() == [1.0, 1.0625, 1.125]
    assert d[3:6].tolist() == [2.0, 2.0625, 2.125]
    assert d[12:14].tolist() == [3.0, 3.0625]


def test_per_request_compliance_and_attainment():
    rec = _records(*zip(*TIMELINES))
    f = request_slo(rec, SLO_)
    assert f.slo_met.tolist() == [True, False, True, True, False, False]
    assert f.num_late_tokens.tolist() == [0, 2, 0, 0, 1, 1]
    assert f.first_late_token.tolist() == [0, 2, 0, 0, 2, 2]
    lat = f.max_lateness_s.to_numpy()
    assert lat[0] == pytest.approx(1.05 - 1.125)  # slacks -0.1, -0.1125, -0.075
    assert lat[1] == pytest.approx(2.2 - 2.0625)
    assert lat[3] == 0.0 and math.isnan(lat[5])
    s = summarize(rec, SLO_)
    assert s["slo_attainment"] == pytest.approx(3 / 6)


def test_goodput_interpolates_and_censors():
    rates, att = [1, 2, 3, 4], [1.0, 0.98, 0.90, 0.5]
    # crossing 0.95 between 2 (0.98) and 3 (0.90): 2 + 0.03 / 0.08
    assert max_rate_meeting(rates, att) == (pytest.approx(2.375), False)
    assert max_rate_meeting(rates, [1.0, 0.99, 0.97, 0.96]) == (4.0, True)  # at least 4
    r, c = max_rate_meeting(rates, [0.9, 0.8, 0.7, 0.6])
    assert math.isnan(r) and c
    recs = [{"policy": "chunked", "request_rate": r, "slo_attainment": a}
            for r, a in zip(rates, att)]
    cap, = grid_capacity(recs, [parse_target("slo_attainment>=95%")])
    assert cap.rate == pytest.approx(2.375) and not cap.censored


def test_goodput_is_not_fooled_by_a_recovery_past_saturation():
    """ConfluxServe Fig. 16, QwenA, MuxWise++ as simulated at main 8821cc1: attainment 95.0 %
    at 14 req/s, 54.9 % at 16, then 95.0-95.4 % at 18-20 (SRPT starving a sub-5 % tail in a
    finite run).
    Goodput is where the curve first drops below 95 %, not "at least 20"."""
    rates = [4, 6, 8, 10, 12, 14, 16, 18, 20]
    att = [1.0, 1.0, 1.0, 0.992, 0.979, 0.950, 0.549, 0.950, 0.954]
    r, censored = max_rate_meeting(rates, att)
    assert not censored and 14.0 <= r < 14.01
    recs = [{"policy": "muxwise++", "request_rate": x, "slo_attainment": a}
            for x, a in zip(rates, att)]
    cap, = grid_capacity(recs, [parse_target("slo_attainment>=95%")])
    assert cap.rate == pytest.approx(r) and cap.text == "14"


def test_distserve_isolated_request_meets_an_slo_just_above_its_ttft():
    from simserve.cost import GpuCostModel
    from simserve.hardware.setup import HardwareConfig, resolve_hardware
    from simserve.models import get_model
    from simserve.run import simulate_point
    from tests.helpers import workload
    hw = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
    res = simulate_point(workload([0.0], [2000], [2]), "llama-3.1-8b", hw, "distserve")
    cost = GpuCostModel(get_model("llama-3.1-8b"), hw.gpu, 2, hw.nvlink)
    ttft = cost.prefill_only_s(2000) + 13.597e-6 + 2000 * 65536 / 386.9e9
    tbt = cost.decode_only_s(1, 2001)
    ok = SLO(ttft_ms=ttft * 1e3 + 1e-3, tbt_ms=tbt * 1e3 + 1e-3)
    late = SLO(ttft_ms=ttft * 1e3 - 1e-3, tbt_ms=1e3)
    assert request_slo(res.records, ok).slo_met.tolist() == [True]
    assert request_slo(res.records, late).slo_met.tolist() == [False]
