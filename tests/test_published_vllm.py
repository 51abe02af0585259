"""The published-measurements file is complete and cited, and its reproduction script runs.

`validation/published/measurements.yaml` holds vLLM serving numbers from public sources;
`benchmarks/published_vllm.py` simulates each row. Here: every row names its source, engine
version, model, GPU, TP, workload and metrics; the fitted values match their fits; the script
runs rows end to end (open loop, closed loop, offline, ShareGPT stand-in); every scored metric
stays within its row class's stated tolerance; rows simserve cannot model are listed with a
reason and never scored.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from simserve.hardware.profile import available_profiles

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "validation" / "published" / "measurements.yaml"
SCRIPT = ROOT / "benchmarks" / "published_vllm.py"

METRICS = {f"{s}_{m}_ms" for s in ("mean", "median", "p99") for m in ("ttft", "tpot", "itl", "e2el")}
METRICS |= {"request_throughput", "output_throughput", "total_token_throughput", "duration"}
ROW_KEYS = ("id", "source", "vllm_version", "engine", "model", "gpu", "tp", "workload",
            "published", "published_as", "mismatches")
SCORED_KEYS = ("simserve", "tolerance_class")
WORKLOAD_KEYS = ("dataset", "input_len", "output_len", "arrival", "request_rate", "num_prompts",
                 "concurrency")
KINDS = {"fixed", "uniform", "sharegpt-approx"}


@pytest.fixture(scope="module")
def data():
    with open(DATA) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("published_vllm", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sources_are_cited(data):
    for key, s in data["sources"].items():
        assert s.get("title") and s.get("date"), key
        assert s.get("url") or (s.get("repository") and s.get("path")), key
        assert s.get("where"), f"{key}: say where in the source the numbers are"


def test_rows_fully_specified(data):
    rows = data["measurements"]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    assert len(rows) >= 6 and len({r["source"] for r in rows}) >= 3
    for r in rows:
        for k in ROW_KEYS:
            assert r.get(k) not in (None, "", [], {}), f"{r.get('id')}: {k} missing"
        assert r["source"] in data["sources"], r["id"]
        assert isinstance(r["tp"], int) and r["tp"] >= 1, r["id"]
        w = r["workload"]
        for k in WORKLOAD_KEYS:
            assert k in w, f"{r['id']}: workload.{k} missing"
        for k in ("dataset", "input_len", "output_len", "arrival", "num_prompts"):
            assert w[k] not in (None, ""), f"{r['id']}: workload.{k} empty"
        # a prompt count that is not a number must say why
        n = w["num_prompts"]
        assert (isinstance(n, int) and n > 0) or (isinstance(n, str) and "not stated (" in n), r["id"]
        rate = w["request_rate"]
        assert rate == "inf" or (isinstance(rate, (int, float)) and rate > 0), r["id"]
        assert w["concurrency"] is None or (isinstance(w["concurrency"], int) and w["concurrency"] >= 1)
        for metric, value in r["published"].items():
            assert metric in METRICS, f"{r['id']}: unknown metric {metric}"
            assert isinstance(value, (int, float)) and value > 0, f"{r['id']}: {metric}"
        if r.get("not_comparable"):
            # listed with the reason simserve cannot model it; nothing to simulate or score
            assert isinstance(r["not_comparable"], str) and len(r["not_comparable"]) > 20, r["id"]
            assert not any(k in r for k in SCORED_KEYS), f"{r['id']}: not comparable yet scored"
            continue
        for k in SCORED_KEYS:
            assert r.get(k), f"{r['id']}: {k} missing"
        assert r["tolerance_class"] in data["tolerance_classes"], r["id"]
        s = r["simserve"]
        assert s["gpu"] in available_profiles(), r["id"]
        assert s["workload"]["kind"] in KINDS, r["id"]
        assert int(s["workload"]["num_requests"]) >= 1
        # the simulated arrival process is the published one
        assert s["workload"].get("concurrency") == w["concurrency"], r["id"]
        if w["concurrency"] is None:
            assert float(s["workload"]["request_rate"]) == float(rate), r["id"]
        if isinstance(n, int):
            assert s["workload"]["num_requests"] == n, r["id"]
        assert int(s["policy"].get("tp", 1)) == r["tp"] == int(s.get("num_gpus", 1)), r["id"]
        # offline rows (LLM.generate on a list) send everything at once
        if s["policy"].get("offline"):
            assert rate == "inf" and w["concurrency"] is None, r["id"]


def test_tolerance_classes_are_stated_and_used(data):
    classes = data["tolerance_classes"]
    used = {r["tolerance_class"] for r in data["measurements"] if not r.get("not_comparable")}
    assert used == set(classes), "a class no row uses, or a row's class not stated"
    for name, c in classes.items():
        assert isinstance(c["max_abs_error_pct"], (int, float)) and c["max_abs_error_pct"] > 0
        assert len(" ".join(str(c["why"]).split())) > 60, f"{name}: say why"


def test_table_covers_both_gpus_and_enough_sources(data, script):
    """The widened table: >= 6 sources and >= 20 scored measurements over H100 and H200."""
    scored = [r for r in data["measurements"] if script.comparable(r)]
    assert len(scored) >= 20 and len({r["source"] for r in scored}) >= 6
    assert {script.gpu_class(r) for r in scored} == {"H100", "H200"}


def test_fitted_values_match_their_fit(data):
    fitted = [r for r in data["measurements"] if "fit" in r]
    assert fitted
    for r in fitted:
        f, L = r["fit"], r["workload"]["input_len"]
        value = f["intercept_ms"] + f["slope_ms_per_token"] * L
        for v in r["published"].values():
            assert abs(v - value) <= 0.005 + 1e-12, r["id"]


def test_published_numbers_agree_with_their_workload(data):
    """Throughput x duration gives back the published token counts (a mistyped number fails)."""
    rows = {r["id"]: r for r in data["measurements"]}
    r = rows["fp8kv-c8-20k"]
    tokens = r["published"]["output_throughput"] * r["published"]["duration"]
    assert abs(tokens / (r["workload"]["num_prompts"] * r["workload"]["output_len"]) - 1) < 0.05
    r = rows["sglang060-70b-offline"]
    per_request = r["published"]["output_throughput"] / r["published"]["request_throughput"]
    assert abs(per_request - r["simserve"]["workload"]["output_mean"]) < 0.5
    r = rows["issue17788-qwen3-32b"]
    per_request = r["published"]["output_throughput"] / r["published"]["request_throughput"]
    assert abs(per_request / r["simserve"]["workload"]["output_mean"] - 1) < 0.01


def test_script_runs_rows_end_to_end(data, script, capsys):
    assert script.main(["--ids", "fp8kv-c1-in1k", "sglang060-70b-rate4", "ci9513-latency-8b",
                        "gpustack-q-8b-fp8kv", "--max-requests", "40"]) == 0
    out = capsys.readouterr().out
    lines = [l for l in out.splitlines() if l.startswith(("fp8kv-c1-in1k ", "sglang060", "ci9513"))]
    assert len(lines) == 5
    for line in lines:
        assert math.isfinite(float(line.split()[-2]))
    assert "median_tpot_ms" in out and "mean_itl_ms" in out and ", offline, n=8" in out
    assert "not comparable (1 measurements" in out and "FP8 KV cache" in out


def test_closed_loop_keeps_the_concurrency(data, script):
    row = next(r for r in data["measurements"] if r["id"] == "fp8kv-c8-20k")
    row = {**row, "workload": {**row["workload"], "input_len": 2000, "output_len": 64}}
    out = script.run_row(row, cap=20)
    fr = out["requests"]
    a, f = fr["arrival_s"].to_numpy(), fr["finish_s"].to_numpy()
    assert np.all(np.isfinite(f)) and out["residual_s"] < 1e-9
    assert np.all(np.diff(a) >= 0) and np.count_nonzero(a == 0) == 8
    # in flight just after each send: never above 8, and exactly 8 while requests remain unsent
    for t in a[8:]:
        in_flight = np.count_nonzero((a <= t + 1e-9) & (f > t + 1e-9))  # ties up to rounding
        assert in_flight <= 8
        if t < a[-1]:
            assert in_flight == 8
    # each later request is sent exactly when some earlier one finished
    assert all(np.isclose(f[:i], t, rtol=0, atol=1e-9).any() for i, t in enumerate(a) if i >= 8)


def test_sharegpt_stand_in_respects_the_filter(data, script):
    row = next(r for r in data["measurements"] if r["id"] == "issue17788-qwen3-32b")
    p, o = script.lengths(row, 2000)
    sim = row["simserve"]["workload"]
    assert p.max() <= sim["max_prompt"] and (p + o).max() <= sim["max_total"] and o.min() >= 1
    assert abs(p.mean() / sim["prompt_mean"] - 1) < 0.15
    assert abs(o.mean() / sim["output_mean"] - 1) < 0.15


def test_gpustack_throughputs_agree_with_their_token_counts(data):
    """Output tok/s over req/s is the mean output the ShareGPT stand-in is scaled to."""
    rows = [r for r in data["measurements"] if r["source"] == "gpustack-perflab"
            and "request_throughput" in r["published"] and "output_throughput" in r["published"]]
    assert len(rows) == 2
    for r in rows:
        per_request = r["published"]["output_throughput"] / r["published"]["request_throughput"]
        assert abs(per_request / r["simserve"]["workload"]["output_mean"] - 1) < 0.005, r["id"]


def test_gpu_class_reads_the_row(script):
    assert script.gpu_class({"id": "a", "gpu": "1x H100 NVL (95 GB stated)"}) == "H100"
    assert script.gpu_class({"id": "b", "gpu": "8x H200 SXM"}) == "H200"
    with pytest.raises(ValueError, match="neither"):
        script.gpu_class({"id": "c", "gpu": "1x A100"})


def test_per_gpu_median_and_worst(script):
    table = [{"id": i, "source": s, "metric": "m", "gpu_class": g, "error_pct": e}
             for i, s, g, e in (("a", "x", "H100", -10.0), ("a", "x", "H100", 30.0),
                                ("b", "y", "H100", 2.0), ("c", "y", "H200", -5.0))]
    out = script.per_gpu(table)
    assert out["H100"]["median_abs_error_pct"] == 10.0
    assert out["H100"]["worst_abs_error_pct"] == 30.0 and out["H100"]["worst"] == "a m"
    assert (out["H100"]["measurements"], out["H100"]["sources"]) == (2, 2)
    assert out["H200"]["median_abs_error_pct"] == 5.0


def test_check_flags_errors_past_their_class(script):
    classes = {"tight": {"max_abs_error_pct": 10}, "loose": {"max_abs_error_pct": 50}}
    table = [{"id": "a", "metric": "m", "error_pct": -12.0, "tolerance_class": "tight"},
             {"id": "b", "metric": "m", "error_pct": 12.0, "tolerance_class": "loose"},
             {"id": "c", "metric": "m", "error_pct": 1.0, "tolerance_class": "nosuch"}]
    bad = script.check(table, classes)
    assert len(bad) == 2 and bad[0].startswith("a m") and "nosuch" in bad[1]


def test_not_comparable_rows_are_never_simulated(data, script, monkeypatch):
    nc = [r for r in data["measurements"] if not script.comparable(r)]
    assert nc, "keep the rows simserve cannot model in the table, with their reason"
    monkeypatch.setattr(script, "run_row", lambda *a, **k: pytest.fail("simulated"))
    table, notes = script.score(nc)
    assert table == [] and notes == []


def test_per_gpu_metric_families(script):
    table = [{"id": i, "metric": m, "gpu_class": g, "error_pct": e}
             for i, m, g, e in (("a", "mean_ttft_ms", "H100", -40.0), ("a", "mean_tpot_ms", "H100", 5.0),
                                ("b", "p99_ttft_ms", "H100", 10.0), ("c", "duration", "H200", -3.0))]
    out = script.per_gpu_metric(table)
    assert out[("H100", "TTFT")]["median_abs_error_pct"] == 25.0
    assert out[("H100", "TTFT")]["worst"] == "a mean_ttft_ms"
    assert out[("H100", "TPOT/ITL")]["metrics"] == 1 and ("H200", "throughput/duration") in out
    with pytest.raises(ValueError):
        script.family("goodput")


def test_every_row_scored_within_its_class_tolerance(data, script):
    """Scores every comparable measurement at its published size and fails when any metric's
    |error| is past its row class's stated tolerance (the file's tolerance_classes)."""
    rows = [r for r in data["measurements"] if script.comparable(r)]
    table, notes = script.score(rows)
    assert len(notes) == len(rows)
    assert len(table) == sum(len(r["published"]) for r in rows)
    assert all(math.isfinite(r["error_pct"]) for r in table)
    assert script.check(table, data["tolerance_classes"]) == []
