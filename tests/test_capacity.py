"""Capacity search: targets, interpolation and censoring on hand-made curves, bisection on a
synthetic curve and on a tiny real experiment, and the `simserve capacity` command."""
from __future__ import annotations

import json
import math

import pytest

from simserve.cli import main
from simserve.errors import SimserveError
from simserve.capacity import (Target, bisect_capacity, grid_capacity, group_keys, parse_target,
                               rate_curves)
from simserve.runner.bisect import bisect_experiment
from simserve.runner.capacity_cli import format_capacity_table, ratio_text
from simserve.runner.config import parse_experiment

TTFT5 = Target("p99_ttft_ms", "<=", 5000.0)
ATT95 = Target("slo_attainment", ">=", 0.95)


def recs(policy, rates, values, metric="p99_ttft_ms", seed=0, **extra):
    return [{"policy": policy, "request_rate": r, "seed": seed, metric: v, **extra}
            for r, v in zip(rates, values)]


def one(records, target):
    (c,) = grid_capacity(records, [target])
    return c


# --------------------------------------------------------------------------- targets


@pytest.mark.parametrize("expr, want", [
    ("p99_ttft_ms<=5000", Target("p99_ttft_ms", "<=", 5000.0)),
    (" mean_normalized_latency_s <= 1 ", Target("mean_normalized_latency_s", "<=", 1.0)),
    ("p99_itl_ms<=1.5e3", Target("p99_itl_ms", "<=", 1500.0)),
    ("slo_attainment>=0.95", ATT95),
    ("slo_attainment>=95%", ATT95),
])
def test_parse_target(expr, want):
    assert parse_target(expr) == want


@pytest.mark.parametrize("expr, words", [
    ("p99_tft_ms<=5000", ["unknown metric", "did you mean 'p99_ttft_ms'"]),
    ("p99_ttft_ms<5000", ["operator '<'", "<= or >="]),
    ("p99_ttft_ms>=5000", ["grows with the request rate", "p99_ttft_ms<=5000"]),
    ("slo_attainment<=0.9", ["falls", "slo_attainment>=0.9"]),
    ("slo_attainment>=95", ["fraction in (0, 1]"]),
    ("p99_ttft_ms<=fast", ["not a number"]),
    ("p99_ttft_ms<=nan", ["finite"]),
    ("p99_ttft_ms", ["METRIC<=VALUE"]),
])
def test_parse_target_errors(expr, words):
    with pytest.raises(SimserveError) as exc:
        parse_target(expr)
    for w in words:
        assert w in str(exc.value)


# --------------------------------------------------------------------------- grid


def test_crossing_between_two_points_is_interpolated_and_seeds_averaged():
    # seed mean at 12 req/s is (7000 + 9000) / 2 = 8000; the crossing of 5000 lies between
    # 8 (3000) and 12 (8000): 8 + (5000 - 3000) * (12 - 8) / (8000 - 3000) = 9.6
    r = recs("a", [4, 8, 12], [1000, 3000, 7000], seed=0) + \
        recs("a", [4, 8, 12], [1000, 3000, 9000], seed=1)
    (curve,) = rate_curves(r, "p99_ttft_ms")
    assert list(curve.values) == [1000, 3000, 8000] and curve.num_seeds == 2
    c = one(r, TTFT5)
    assert c.rate == pytest.approx(9.6, abs=1e-12) and not c.censored
    assert c.bounds == (c.rate, c.rate) and c.text == "9.6"


def test_attainment_crossing_is_interpolated():
    # last passing point 8 (0.99), next 12 (0.79): 8 + (0.99 - 0.95) * 4 / (0.99 - 0.79) = 8.8
    c = one(recs("a", [4, 8, 12], [1.0, 0.99, 0.79], "slo_attainment"), ATT95)
    assert c.rate == pytest.approx(8.8) and not c.censored


def test_curve_that_never_crosses_is_censored_high():
    c = one(recs("a", [4, 8, 12], [100, 200, 4999]), TTFT5)
    assert (c.rate, c.censored) == (12.0, True)
    assert c.bounds == (12.0, math.inf) and c.text == "≥ 12" and c.censored_text == "yes, high"


def test_curve_that_starts_above_target_is_censored_low():
    c = one(recs("a", [4, 8, 12], [6000, 7000, 9000]), TTFT5)
    assert math.isnan(c.rate) and c.censored
    assert c.bounds == (0.0, 4.0) and c.text == "< 4" and c.censored_text == "yes, low"
    c = one(recs("a", [4, 8], [0.5, 0.2], "slo_attainment"), ATT95)
    assert math.isnan(c.rate) and c.censored


def test_noisy_non_monotone_curves():
    # latency: the first crossing counts (4 + 4000·4/5000 = 7.2), not the later dip at 12
    c = one(recs("a", [4, 8, 12, 16], [1000, 6000, 3000, 8000]), TTFT5)
    assert c.rate == pytest.approx(7.2) and not c.censored
    # attainment too (goodput is the highest *sustained* rate): 4 + 0.05·4/0.1, not the
    # recovery at 12
    c = one(recs("a", [16, 4, 12, 8], [0.5, 1.0, 0.97, 0.9], "slo_attainment"), ATT95)
    assert c.rate == pytest.approx(4 + 0.05 * 4 / 0.1) and not c.censored


def test_nan_point_fails_and_is_not_interpolated_to():
    c = one(recs("a", [4, 8, 12], [1000, float("nan"), 9000]), TTFT5)
    assert (c.rate, c.censored) == (4.0, True)  # at least 4
    # a NaN seed makes its rate fail
    r = recs("a", [4, 8], [1000, 2000], seed=0) + recs("a", [4, 8], [1000, None], seed=1)
    assert one(r, TTFT5).rate == 4.0


def test_groups_ratios_and_table():
    r = (recs("vllm", [4, 8, 12], [1000, 3000, 8000], point="p1", variant=None) +
         recs("neo", [4, 8, 12], [1000, 2000, 4000], point="p2", variant=None) +
         recs("neo", [4, 8, 12], [6000, 7000, 8000], point="p3", variant="slow") +
         recs("vllm", [4, 8, 12], [1000, 2000, 3000], point="p4", variant="slow",
              **{"policies.0.max_num_seqs": 64}))
    assert group_keys(r) == ["policy", "variant", "policies.0.max_num_seqs"]
    caps = grid_capacity(r, [TTFT5])
    assert len(caps) == 4
    vllm, neo, neo_slow, vllm_slow = caps
    assert vllm.rate == pytest.approx(9.6) and neo.text == "≥ 12" and neo_slow.text == "< 4"
    assert ratio_text(vllm, vllm) == "1.00"
    assert ratio_text(vllm, neo) == f"≤ {9.6 / 12:.2f}"      # neo is at least 12
    assert ratio_text(neo, vllm) == f"≥ {12 / 9.6:.2f}"
    assert ratio_text(neo, vllm_slow) == "?"                  # both only bounded below
    assert ratio_text(neo_slow, vllm) == f"≤ {4 / 9.6:.2f}"
    table = format_capacity_table(caps)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["policy", "variant", "policies.0.max_num_seqs"]
    assert "vs best" in lines[0] and "vs row 1" in lines[0] and len(lines) == 2 + 4
    assert "9.6" in lines[2] and "≥ 12" in lines[3] and "< 4" in lines[4]


# --------------------------------------------------------------------------- bisection


def quadratic(calls):
    def f(rate):
        calls.append(rate)
        return rate * rate / 100.0  # <= 4 up to rate 20
    return f


@pytest.mark.parametrize("start, lo, hi", [((1, 2), None, None), ((50, 100), None, None),
                                            ((1, 2), 3.0, 64.0), ((1, 2), None, 25.0)])
def test_bisection_converges_on_a_monotone_curve(start, lo, hi):
    calls = []
    t = Target("p99_ttft_ms", "<=", 4.0)
    c = bisect_capacity(quadratic(calls), t, lo=lo, hi=hi, start=start, rtol=0.01)
    a, b = c.bracket
    assert not c.censored and a <= 20 <= b and b - a <= 0.01 * a
    assert a <= c.rate <= b and c.rate == pytest.approx(20, rel=1e-3)
    assert c.num_simulations == len(calls) == len(set(calls)) <= 20
    assert c.method == "bisect" and c.text == f"{c.rate:.4g}"


def test_bisection_absolute_tolerance_and_falling_metric():
    t = Target("slo_attainment", ">=", 0.95)
    c = bisect_capacity(lambda r: 1.0 if r < 7 else max(0.0, 1 - (r - 7) / 10), t,
                        start=(1, 4), rtol=0.0, atol=0.05)
    a, b = c.bracket
    assert a <= 7.5 <= b and b - a <= 0.05 and a <= c.rate <= b


def test_bisection_censoring():
    t = Target("p99_ttft_ms", "<=", 4.0)
    c = bisect_capacity(lambda r: r, t, lo=5.0, hi=10.0)           # even lo fails
    assert math.isnan(c.rate) and c.censored and c.text == "< 5"
    c = bisect_capacity(lambda r: 0.0, t, lo=1.0, hi=10.0)         # even hi passes
    assert c.rate == 10.0 and c.censored and c.text == "≥ 10"
    c = bisect_capacity(lambda r: 0.0, t, start=(1, 2), max_expand=3)
    assert c.rate == 16.0 and c.censored and c.num_simulations == 5  # 1, 2, 4, 8, 16
    c = bisect_capacity(lambda r: float("nan") if r > 3 else 1.0, t, start=(1, 2), rtol=0.01)
    assert c.bracket[0] <= 3 <= c.bracket[1] and c.rate == c.bracket[0]  # NaN: no interpolation


@pytest.mark.parametrize("kw, word", [({"lo": 4.0, "hi": 2.0}, "lo < hi"),
                                      ({"lo": -1.0}, "positive"),
                                      ({"rtol": 0.0}, "tolerance")])
def test_bisection_bad_input(kw, word):
    with pytest.raises(SimserveError, match=word):
        bisect_capacity(lambda r: r, TTFT5, **kw)


TINY = {
    "name": "tiny", "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "num_gpus": 1},
    "workload": {"trace": "synthetic-conversation", "num_requests": 100, "arrival": "poisson",
                 "rates": [4, 16], "seed": 0},
    "policies": [{"name": "vllm", "max_num_batched_tokens": 2048}],
    "slo": {"ttft_ms": 1000, "tbt_ms": 100},
}


def test_bisection_on_a_tiny_real_experiment():
    cfg = parse_experiment(TINY)
    t = parse_target("p99_ttft_ms<=1000")
    (c,), nsim = bisect_experiment(cfg, [t], rtol=0.05)
    a, b = c.bracket
    assert not c.censored and b - a <= 0.05 * a and a <= c.rate <= b
    probes = dict(c.probes)
    assert probes[a] <= 1000 < probes[b]
    assert nsim == c.num_simulations == len(probes)


# --------------------------------------------------------------------------- command line


def test_capacity_command_on_a_results_folder(tmp_path, capsys):
    r = recs("vllm", [4, 8, 12], [1000, 3000, 8000]) + recs("neo", [4, 8, 12], [500, 900, 2000])
    for x in r:
        x["slo_attainment"] = 1.0 if x["request_rate"] < 10 else 0.5
    (tmp_path / "summary.json").write_text(json.dumps(r))
    assert main(["capacity", str(tmp_path), "--target", "p99_ttft_ms<=5000",
                 "--target", "slo_attainment>=95%"]) == 0
    out = capsys.readouterr().out
    assert "target p99_ttft_ms <= 5000" in out and "target slo_attainment >= 0.95" in out
    assert "9.6" in out and "≥ 12" in out and "vs vllm" in out
    assert main(["capacity", str(tmp_path / "summary.json"), "--json",
                 "--target", "p99_ttft_ms<=5000"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(x["policy"], x["rate"], x["censored"]) for x in rows] == [
        ("vllm", pytest.approx(9.6), False), ("neo", 12.0, True)]
    assert rows[1]["upper_bound"] is None


@pytest.mark.parametrize("args, word", [
    (["--target", "p99_ttft_ms<=5000", "--lo", "2"], "--lo: only with --bisect"),
    (["--target", "p99_ttf_ms<=5000"], "did you mean 'p99_ttft_ms'"),
    (["--target", "request_goodput<=5"], "no request_goodput <= 5 in these results"),
    (["--bisect"], "--bisect needs an experiment YAML"),
])
def test_capacity_command_bad_input(tmp_path, capsys, args, word):
    (tmp_path / "summary.json").write_text(json.dumps(recs("a", [4, 8], [1, 2])))
    assert main(["capacity", str(tmp_path), *args]) == 2
    assert word in capsys.readouterr().err


def test_capacity_command_bad_files(tmp_path, capsys):
    assert main(["capacity", str(tmp_path / "nope")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["capacity", str(tmp_path)]) == 2
    assert "summary.json" in capsys.readouterr().err
    (tmp_path / "summary.json").write_text("{not json")
    assert main(["capacity", str(tmp_path)]) == 2
    assert "not a JSON summary" in capsys.readouterr().err


def test_capacity_command_bisects_and_runs_grids_of_an_experiment(tmp_path, capsys):
    import yaml
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(TINY))
    assert main(["capacity", str(f), "--bisect", "--tol", "0.1",
                 "--target", "slo_attainment>=0.9"]) == 0
    out = capsys.readouterr().out
    assert "adaptive bisection" in out and "bracket req/s" in out and "simulations in all" in out
    assert main(["capacity", str(f), "--target", "p99_ttft_ms<=1000"]) == 0
    out = capsys.readouterr().out
    assert "running its rate grid" in out and "measured req/s" in out
