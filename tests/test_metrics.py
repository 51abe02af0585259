"""simserve.metrics: analytic cases, a per-request reference, invariants, rate-curve conventions."""
from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.metrics import (SLO, itl_gaps_s, max_rate_meeting, request_frame, summarize,
                              sustainable_rate)
from simserve.sim.records import RequestRecords

NAN = math.nan


def build(arrivals, tokens, prompts=None, preemptions=None) -> RequestRecords:
    """Records from per-request token-time lists; a NaN token marks an unfinished request."""
    n = len(arrivals)
    out = np.array([len(t) for t in tokens], dtype=np.int64)
    flat = np.array([x for t in tokens for x in t], dtype=np.float64)
    fin = np.array([t[-1] if not any(math.isnan(x) for x in t) else NAN for t in tokens])
    return RequestRecords(
        arrival_s=np.asarray(arrivals, dtype=np.float64),
        prompt_tokens=np.asarray(prompts if prompts is not None else [100] * n, dtype=np.int64),
        output_tokens=out,
        first_token_s=np.array([t[0] for t in tokens], dtype=np.float64),
        finish_s=fin,
        token_offsets=np.concatenate([[0], np.cumsum(out)]).astype(np.int64),
        token_times_s=flat,
        num_preemptions=np.asarray(preemptions if preemptions is not None else [0] * n, dtype=np.int64),
    )


# Dyadic times so every expected value below is exact in binary floating point.
EVEN = build(
    arrivals=[0.0, 1.0, 2.0, 3.0],
    tokens=[
        [0.5, 0.625, 0.75, 0.875],  # TTFT 0.5, 3 gaps of 0.125
        [1.25, 1.5],                # TTFT 0.25, 1 gap of 0.25
        [2.5],                      # single token: no TPOT, no gap
        [3.5, NAN, NAN],            # unfinished after its first token
    ],
    prompts=[10, 20, 30, 40],
    preemptions=[0, 1, 0, 2],
)


def test_request_frame_even_tokens():
    f = request_frame(EVEN)
    assert list(f.columns) == [
        "request_id", "scheduled_s", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s",
        "ttft_s", "e2el_s", "tpot_s", "mean_itl_s", "max_itl_s", "normalized_latency_s",
        "num_preemptions"]
    np.testing.assert_array_equal(f.ttft_s, [0.5, 0.25, 0.5, 0.5])
    np.testing.assert_array_equal(f.e2el_s, [0.875, 0.5, 0.5, NAN])
    np.testing.assert_array_equal(f.tpot_s, [0.125, 0.25, NAN, NAN])
    np.testing.assert_array_equal(f.mean_itl_s, [0.125, 0.25, NAN, NAN])
    np.testing.assert_array_equal(f.max_itl_s, [0.125, 0.25, NAN, NAN])
    np.testing.assert_array_equal(f.normalized_latency_s, [0.875 / 4, 0.25, 0.5, NAN])
    np.testing.assert_array_equal(f.num_preemptions, [0, 1, 0, 2])


def test_summary_even_tokens():
    s = summarize(EVEN)
    assert s["completed"] == 3 and s["num_unfinished"] == 1
    assert s["duration"] == 2.5  # first arrival 0.0 to last finish 2.5
    assert s["total_input_tokens"] == 60 and s["total_output_tokens"] == 7  # finished only
    assert s["request_throughput"] == 3 / 2.5
    assert s["output_throughput"] == 7 / 2.5
    assert s["total_token_throughput"] == 67 / 2.5
    assert s["mean_ttft_ms"] == pytest.approx(1250 / 3)
    assert s["median_ttft_ms"] == 500.0
    # ITL pools [125, 125, 125, 250]; p90 by linear interpolation at rank 2.7: 125 + 0.7*125.
    assert s["mean_itl_ms"] == 156.25 and s["median_itl_ms"] == 125.0
    assert s["p90_itl_ms"] == pytest.approx(212.5) and s["p99_itl_ms"] == pytest.approx(246.25)
    assert s["std_itl_ms"] == pytest.approx(np.std([125, 125, 125, 250]))
    assert (s["mean_tpot_ms"], s["std_tpot_ms"], s["p50_tpot_ms"]) == (187.5, 62.5, 187.5)
    assert s["mean_e2el_ms"] == 625.0 and s["p50_e2el_ms"] == 500.0
    assert s["mean_normalized_latency_s"] == pytest.approx((0.875 / 4 + 0.25 + 0.5) / 3)
    assert "slo_attainment" not in s and "request_goodput" not in s


def test_summary_keys_and_plain_types():
    s = summarize(EVEN, SLO(ttft_ms=500, tbt_ms=125))
    expected = {"completed", "duration", "total_input_tokens", "total_output_tokens",
                "request_throughput", "output_throughput", "total_token_throughput",
                "mean_normalized_latency_s", "num_unfinished", "slo_attainment", "request_goodput",
                "slo_goodput", "keep_up_ratio", "backlog_requests_at_last_arrival",
                "backlog_tokens_at_last_arrival"}
    for m in ("ttft", "tpot", "itl", "e2el"):
        expected |= {f"{k}_{m}_ms" for k in ("mean", "median", "std", "p50", "p90", "p99")}
    assert set(s) == expected
    assert all(type(v) in (int, float) for v in s.values())
    assert type(s["completed"]) is int and type(s["total_output_tokens"]) is int
    json.loads(json.dumps(s))


def test_slo_deadline_missed_by_epsilon():
    slo = SLO(ttft_ms=500, tbt_ms=125)  # deadlines a+0.5, a+0.625, a+0.75, ...
    on_time = [1.5, 1.625, 1.75, 1.875]
    late = [1.5, 1.625, 1.75 + 1e-9, 1.875]  # token 3 misses by 1 ns, the others are exact
    early_then_late = [1.0, 1.1, 1.2, 1.875 + 1e-9]
    late_first = [1.5 + 1e-9, 1.5 + 2e-9]
    rec = build([1.0] * 5, [on_time, late, early_then_late, late_first, [1.5, NAN]])
    f = request_frame(rec, slo)
    assert f.slo_met.dtype == bool
    assert f.slo_met.tolist() == [True, False, False, False, False]
    s = summarize(rec, slo)
    assert s["slo_attainment"] == 1 / 5  # unfinished request counts in the denominator
    assert s["slo_goodput"] == pytest.approx(1 / s["duration"])
    # vLLM's goodput checks TTFT only (no tpot_ms/e2el_ms given): three finished requests
    # have TTFT <= 500 ms; the per-token lateness of two of them does not count
    assert s["request_goodput"] == pytest.approx(3 / s["duration"])
    assert s["duration"] == pytest.approx(0.875 + 1e-9)


def test_request_goodput_is_vllms_ttft_tpot_e2el_thresholds():
    # TTFT 0.5 s each; TPOT 0.125, 0.25, (one token: 0 in vLLM); E2E 0.875, 1.25, 0.5
    rec = build([1.0] * 3, [[1.5, 1.625, 1.75, 1.875], [1.5, 1.75, 2.0, 2.25], [1.5]])
    dur = 2.25 - 1.0
    good = lambda **kw: summarize(rec, SLO(ttft_ms=500, tbt_ms=1, **kw))["request_goodput"] * dur
    assert good() == pytest.approx(3)
    assert good(tpot_ms=125) == pytest.approx(2)          # the one-token request passes TPOT
    assert good(tpot_ms=124.9) == pytest.approx(1)
    assert good(e2el_ms=875) == pytest.approx(2)
    assert good(tpot_ms=125, e2el_ms=500) == pytest.approx(1)
    assert summarize(rec, SLO(ttft_ms=499, tbt_ms=1000))["request_goodput"] == 0


def test_empty_and_all_unfinished_give_nan():
    empty = build([], [])
    with np.errstate(all="raise"):
        s = summarize(empty, SLO(1000, 50))
    assert s["completed"] == 0 and s["num_unfinished"] == 0
    assert math.isnan(s["duration"]) and math.isnan(s["p99_itl_ms"]) and math.isnan(s["slo_attainment"])
    assert len(request_frame(empty, SLO(1000, 50))) == 0
    s = summarize(build([0.0, 1.0], [[0.5, NAN], [NAN]]), SLO(1000, 50))
    assert s["completed"] == 0 and s["num_unfinished"] == 2
    assert math.isnan(s["request_throughput"]) and math.isnan(s["mean_ttft_ms"])
    assert s["slo_attainment"] == 0.0 and math.isnan(s["request_goodput"])
    # Only single-token requests: TPOT and ITL are empty sets, TTFT is not.
    s = summarize(build([0.0], [[0.25]]))
    assert math.isnan(s["mean_tpot_ms"]) and math.isnan(s["p99_itl_ms"]) and s["mean_ttft_ms"] == 250.0


def test_invalid_inputs():
    with pytest.raises(ValueError, match="tbt_ms"):
        SLO(ttft_ms=1000, tbt_ms=0)
    with pytest.raises(ValueError, match="ttft_ms"):
        SLO(ttft_ms=-1, tbt_ms=50)
    bad = build([0.0], [[0.5, 0.75]])
    object.__setattr__(bad, "output_tokens", np.array([3]))
    with pytest.raises(ValueError, match="token_offsets"):
        summarize(bad)


# --------------------------------------------------------------------------- properties


@st.composite
def records(draw, sorted_tokens=True):
    n = draw(st.integers(0, 8))
    arrivals, tokens = [], []
    t = 0.0
    for _ in range(n):
        t += draw(st.floats(0, 5))
        k = draw(st.integers(1, 6))
        ttft = draw(st.floats(0, 3))
        gaps = draw(st.lists(st.floats(0, 2) if sorted_tokens else st.floats(-2, 2), min_size=k - 1, max_size=k - 1))
        times = list(np.cumsum([t + ttft, *gaps]))
        cut = draw(st.integers(1, k))  # cut < k: unfinished after `cut` tokens
        if cut < k and draw(st.booleans()):
            times = times[:cut] + [NAN] * (k - cut)
        arrivals.append(t)
        tokens.append(times)
    return build(arrivals, tokens)


def reference(rec: RequestRecords, slo: SLO) -> tuple[list, list, list]:
    """Per-request loop: pooled ITL, max ITL and SLO compliance, straight from the definitions."""
    itl, max_itl, met = [], [], []
    for i in range(rec.num_requests):
        t = rec.token_times(i)
        done = not math.isnan(rec.finish_s[i])
        g = np.diff(t)
        if done:
            itl.extend(g)
        max_itl.append(g.max() if done and len(g) else NAN)
        dl = rec.arrival_s[i] + slo.ttft_ms / 1e3 + np.arange(len(t)) * (slo.tbt_ms / 1e3)
        met.append(done and bool(np.all(t <= dl)))
    return itl, max_itl, met


@settings(max_examples=200, deadline=None)
@given(records(sorted_tokens=False), st.floats(1, 3000), st.floats(1, 500))
def test_matches_per_request_reference(rec, ttft_ms, tbt_ms):
    slo = SLO(ttft_ms, tbt_ms)
    f = request_frame(rec, slo)
    itl, max_itl, met = reference(rec, slo)
    np.testing.assert_array_equal(f.max_itl_s, max_itl)
    assert f.slo_met.tolist() == met
    s = summarize(rec, slo)
    np.testing.assert_array_equal(itl_gaps_s(rec), itl)
    if itl:
        assert s["p99_itl_ms"] == pytest.approx(np.percentile(np.array(itl) * 1e3, 99))
        assert s["mean_itl_ms"] == pytest.approx(np.mean(itl) * 1e3)


@settings(max_examples=200, deadline=None)
@given(records())
def test_tpot_identity_and_nonnegative_itl(rec):
    f = request_frame(rec)
    multi = f[f.tpot_s.notna()]
    assert (multi.output_tokens > 1).all()
    np.testing.assert_allclose(multi.tpot_s * (multi.output_tokens - 1) + multi.ttft_s, multi.e2el_s,
                               rtol=1e-12, atol=1e-12)
    assert (itl_gaps_s(rec) >= 0).all()
    assert len(itl_gaps_s(rec)) == (f.output_tokens - 1)[f.finish_s.notna()].sum()
    s = summarize(rec)
    assert math.isnan(s["p50_itl_ms"]) or s["p50_itl_ms"] >= 0
    assert s["completed"] + s["num_unfinished"] == rec.num_requests


@settings(max_examples=200, deadline=None)
@given(records(sorted_tokens=False), st.floats(1, 3000), st.floats(1, 500),
       st.floats(0, 2000), st.floats(0, 200))
def test_attainment_monotone_in_slo(rec, ttft_ms, tbt_ms, d_ttft, d_tbt):
    tight = request_frame(rec, SLO(ttft_ms, tbt_ms)).slo_met
    loose = request_frame(rec, SLO(ttft_ms + d_ttft, tbt_ms + d_tbt)).slo_met
    assert not (tight & ~loose).any()  # per request, hence also the attainment


def test_large_run_is_fast():
    rng = np.random.default_rng(0)
    n = 20_000
    out = rng.integers(1, 200, n)
    arrival = np.sort(rng.uniform(0, 2000, n))
    off = np.concatenate([[0], np.cumsum(out)])
    c = np.cumsum(rng.exponential(0.05, off[-1]))
    times = np.repeat(arrival + rng.exponential(1.0, n), out) + c - np.repeat(c[off[:-1]], out)
    rec = RequestRecords(arrival, rng.integers(1, 4000, n), out, times[off[:-1]], times[off[1:] - 1],
                         off, times, np.zeros(n, dtype=np.int64))
    t0 = time.perf_counter()
    s = summarize(rec, SLO(1000, 50))
    request_frame(rec, SLO(1000, 50))
    assert time.perf_counter() - t0 < 5.0
    assert s["completed"] == n and s["total_output_tokens"] == int(out.sum())
    assert s["mean_tpot_ms"] > 0


# --------------------------------------------------------------------------- rate curves


def test_sustainable_rate_interpolates_first_crossing():
    assert sustainable_rate([1, 2, 3, 4], [0.2, 0.6, 1.4, 3.0], 1.0) == (pytest.approx(2.5), False)
    # Unsorted input is sorted by rate first.
    assert sustainable_rate([3, 1, 4, 2], [1.4, 0.2, 3.0, 0.6], 1.0) == (pytest.approx(2.5), False)
    # Equal to the target passes; the crossing is then exactly at that point.
    assert sustainable_rate([1, 2, 3], [0.5, 1.0, 2.0], 1.0) == (2.0, False)
    # Non-monotone (noisy) curve: the FIRST crossing counts, the later recovery does not.
    assert sustainable_rate([1, 2, 3, 4], [0.5, 1.5, 0.8, 2.0], 1.0) == (pytest.approx(1.5), False)


def test_sustainable_rate_censoring():
    r, c = sustainable_rate([2, 3, 4], [1.2, 2, 3], 1.0)  # already above target at the lowest rate
    assert math.isnan(r) and c
    assert sustainable_rate([2, 3, 4], [0.1, 0.2, 0.3], 1.0) == (4.0, True)  # never crosses
    assert sustainable_rate([2, 3, 4], [0.1, 0.2, NAN], 1.0) == (3.0, True)  # NaN fails, no interpolation
    r, c = sustainable_rate([2], [NAN], 1.0)
    assert math.isnan(r) and c
    with pytest.raises(ValueError, match="duplicate"):
        sustainable_rate([1, 1, 2], [0, 1, 2], 1.0)
    with pytest.raises(ValueError, match="lengths"):
        sustainable_rate([1, 2], [0], 1.0)


def test_max_rate_meeting():
    assert max_rate_meeting([1, 2, 3, 4], [1.0, 0.99, 0.9, 0.5]) == (pytest.approx(2 + 0.04 / 0.09), False)
    # Dip and recovery: the first crossing counts, as in sustainable_rate (no rate above a
    # failing one is sustained); the recovery at 3 does not.
    assert max_rate_meeting([1, 2, 3, 4], [0.96, 0.9, 0.97, 0.5]) == (pytest.approx(1 + 0.01 / 0.06), False)
    # a recovery up to the highest rate is not "at least the highest rate" either
    assert max_rate_meeting([1, 2, 3], [0.99, 0.9, 0.99]) == (pytest.approx(1 + 0.04 / 0.09), False)
    # a NaN point fails: the last passing rate before it, censored (cannot interpolate)
    assert max_rate_meeting([1, 2, 3], [0.99, math.nan, 0.99]) == (1.0, True)
    assert max_rate_meeting([1, 2, 3], [0.99, 0.98, 0.96]) == (3.0, True)
    r, c = max_rate_meeting([1, 2, 3], [0.9, 0.8, 0.7])
    assert math.isnan(r) and c
    assert max_rate_meeting([1, 2], [0.95, 0.5], threshold=0.95) == (1.0, False)
    assert max_rate_meeting([1, 2], [0.97, 0.93], threshold=0.95) == (pytest.approx(1.5), False)
    with pytest.raises(ValueError, match="threshold"):
        max_rate_meeting([1, 2], [1, 1], threshold=95)
