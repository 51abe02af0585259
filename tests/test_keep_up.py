"""Sustained goodput (issue 13 §6): 95 % attainment counts only where the system keeps up."""
from __future__ import annotations

import math

import pytest

from simserve.capacity import SUSTAINED_GOODPUT, grid_capacity, parse_target
from simserve.metrics import keep_up, max_rate_meeting, summarize, sustained_goodput
from tests.test_metrics import build

NAN = math.nan


def test_keep_up_counts_work_in_the_second_half_of_the_arrival_window():
    # arrivals at 0, 2, 4 and 8: window [0, 8], second half (4, 8]. Offered there: request 3
    # (t=8, 100 + 2 tokens); request 2 (t=4) sits on the boundary and belongs to the first half.
    # Delivered in (4, 8]: the prompts of 1 (first token at 5) and 2 (at 4.5), 200 tokens, and
    # the output tokens at 6 (request 0), 5 and 6 (1), 4.5 and 7 (2): 205 of 102 offered (the
    # first half's requests drain here: the ratio is a rate ratio, not a completed fraction).
    rec = build(arrivals=[0.0, 2.0, 4.0, 8.0],
                tokens=[[1.0, 6.0], [5.0, 6.0], [4.5, 7.0], [9.0, 10.0]],
                prompts=[100, 100, 100, 100])
    k = keep_up(rec)
    assert k["keep_up_ratio"] == pytest.approx(205 / 102)
    # at t=8 request 3 has arrived and not been prefilled (102 tokens); 0, 1, 2 are done
    assert k["backlog_requests_at_last_arrival"] == 1
    assert k["backlog_tokens_at_last_arrival"] == 102


def test_a_starved_long_prompt_fails_keep_up_while_attainment_counts_it_as_5_percent():
    # 20 short requests served at once, one long prompt (10,000 tokens) in the late window
    # never prefilled before the arrivals end: 19/20 = 95 % of requests are fine
    arr = [float(i) for i in range(20)]
    toks = [[a + 0.5, a + 0.75] for a in arr]
    toks[15] = [100.0, 100.5]                   # the starved one, served after the window
    prompts = [100] * 20
    prompts[15] = 10_000
    rec = build(arrivals=arr, tokens=toks, prompts=prompts)
    k = keep_up(rec)
    # second half (9.5, 19]: requests 10..19 offered 9 * 102 + 10,002. Delivered: 10..14 and
    # 16..18 whole (8 * 102), request 9's second token (9.75); not 15, nor 19 (first token 19.5)
    offered = 9 * 102 + 10_002
    delivered = 8 * 102 + 1
    assert k["keep_up_ratio"] == pytest.approx(delivered / offered)
    assert k["keep_up_ratio"] < 0.95
    assert k["backlog_requests_at_last_arrival"] == 2          # 15 and 19
    assert k["backlog_tokens_at_last_arrival"] == 10_002 + 102


def test_keep_up_is_in_the_summary_and_nan_without_a_window():
    one = build(arrivals=[0.0], tokens=[[1.0]])
    assert math.isnan(summarize(one)["keep_up_ratio"])
    assert set(keep_up(one)) <= set(summarize(one))


def test_sustained_goodput_is_the_first_failure_of_either_reading():
    rates = [10, 20, 30, 40]
    att = [1.0, 0.99, 0.97, 0.96]          # never below 95 %: plain goodput "≥ 40", censored
    up = [1.0, 0.99, 0.85, 0.6]             # falls behind between 20 and 30
    assert max_rate_meeting(rates, att) == (40.0, True)
    rate, cens = sustained_goodput(rates, att, up)
    assert not cens and rate == pytest.approx(20 + (0.95 - 0.99) * 10 / (0.85 - 0.99))
    # where keep-up holds, the sustained reading is the attainment one
    assert sustained_goodput(rates, [1, 0.97, 0.9, 0.8], [1, 1, 1, 1]) == \
        max_rate_meeting(rates, [1, 0.97, 0.9, 0.8])
    # the lowest rate already behind: censored low
    r, c = sustained_goodput(rates, att, [0.5, 0.5, 0.5, 0.5])
    assert math.isnan(r) and c


def test_capacity_reports_plain_and_sustained_goodput():
    recs = [dict(policy="p", request_rate=r, slo_attainment=a, keep_up_ratio=u)
            for r, a, u in zip([10, 20, 30, 40], [1.0, 0.99, 0.97, 0.96], [1.0, 0.99, 0.85, 0.6])]
    plain, sus = grid_capacity(recs, [parse_target("slo_attainment>=0.95"),
                                      parse_target(SUSTAINED_GOODPUT)])
    assert plain.rate == 40 and plain.censored
    assert 20 < sus.rate < 30 and not sus.censored
    assert str(sus.target) == "slo_attainment >= 0.95 & keep_up_ratio >= 0.95"
