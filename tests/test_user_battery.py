"""A scripted battery of what a user tries: vLLM-style SLOs, zero-output trace rows, vLLM's
summary.json, the names `run` accepts elsewhere, `regress` on one's own folder, the Python
API on one's own Workload and DataFrames, and a fresh clone's trace-less test run. Refused
input: exit status 2 and one line on stderr naming what is wrong, never a traceback."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import simserve
from simserve.cli import main
from simserve.errors import ConfigError, SimserveError

SMALL = """\
name: small
model: llama-3.1-8b
hardware: {gpu: h100-sxm, num_gpus: 1}
workload: {trace: synthetic-conversation, num_requests: 60, arrival: poisson, rates: [3, 9], seed: 0}
policies:
  - {name: vllm}
"""


def run(argv) -> int:
    """`simserve ARGV` in this process (paths as text)."""
    return main([str(a) for a in argv])


def _exp(tmp_path, extra: str = "", text: str = SMALL, name: str = "exp.yaml"):
    p = tmp_path / name
    p.write_text(text + extra)
    return p


def _refused(capsys, argv, *needles) -> str:
    """`simserve ARGV` exits 2 with one line on stderr holding every needle."""
    assert run([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


def _records(folder):
    from simserve.capacity import load_records
    return load_records(folder)


# ---------------------------------------------------------------- SLOs, vLLM's and simserve's

def test_vllm_slo_ttft_and_tpot_without_tbt_runs(tmp_path):
    cfg = _exp(tmp_path, "slo: {ttft_ms: 400, tpot_ms: 30}\n")
    assert run(["run", cfg, "--out", tmp_path / "o", "-q"]) == 0
    recs = _records(tmp_path / "o")
    for r in recs:  # attainment = share of requests within every threshold given
        assert 0 <= r["slo_attainment"] <= 1
        assert r["slo_goodput"] == pytest.approx(r["request_goodput"])
    s, q = simserve.load_results(tmp_path / "o")
    good = (q.ttft_s * 1e3 <= 400) & (q.tpot_s.fillna(0) * 1e3 <= 30) & q.finish_s.notna()
    assert q.slo_met.tolist() == good.tolist()  # per request, exactly vLLM's criteria


def test_vllm_slo_e2el_alone_runs(tmp_path):
    cfg = _exp(tmp_path, "slo: {e2el_ms: 2000}\n")
    assert run(["run", cfg, "--out", tmp_path / "o", "-q"]) == 0
    s, q = simserve.load_results(tmp_path / "o")
    met = q.groupby("request_rate").slo_met.mean().to_numpy()
    assert np.allclose(sorted(s.slo_attainment), sorted(met))


def test_simserves_own_slo_form_is_unchanged(tmp_path):
    cfg = _exp(tmp_path, "slo: {ttft_ms: 400, tbt_ms: 50}\n")
    assert run(["run", cfg, "--no-save", "-q"]) == 0


@pytest.mark.parametrize("slo, needle", [
    ("{tbt_ms: 50}", "give ttft_ms too"),
    ("{}", "at least one of ttft_ms"),
    ("{ttft_ms: -1}", "ttft_ms: expected a positive number"),
    ("{ttft_ms: 100, tpot: 5}", "did you mean 'tpot_ms'"),
    ("{e2el_ms: .inf}", "e2el_ms: expected a positive number"),
])
def test_bad_slo_is_one_line(tmp_path, capsys, slo, needle):
    cfg = _exp(tmp_path, f"slo: {slo}\n")
    _refused(capsys, ["run", cfg, "--no-save", "-q"], needle, "exp.yaml")


# ---------------------------------------------------------------- zero-output trace rows

def _trace(tmp_path, rows: str):
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    return "workload: {trace: t.csv, num_requests: null, arrival: trace}\n"


def test_zero_output_row_is_refused_naming_its_line(tmp_path, capsys):
    wl = _trace(tmp_path, "0.0,100,20\n0.5,100,0\n1.0,100,5\n")
    cfg = _exp(tmp_path, text=SMALL.replace(SMALL.splitlines()[3] + "\n", wl))
    _refused(capsys, ["run", cfg, "--no-save", "-q"], "t.csv:3:", "output length of 0",
             "zero_output: one")


def test_zero_output_counted_as_one_when_asked(tmp_path):
    wl = _trace(tmp_path, "0.0,100,20\n0.5,100,0\n1.0,100,5\n").replace(
        "arrival: trace}", "arrival: trace, zero_output: one}")
    cfg = _exp(tmp_path, text=SMALL.replace(SMALL.splitlines()[3] + "\n", wl))
    assert run(["run", cfg, "--out", tmp_path / "o", "-q"]) == 0
    r = _records(tmp_path / "o")[0]
    assert r["num_zero_output"] == 1 and r["total_output_tokens"] == 26


def test_bad_zero_output_value_is_one_line(tmp_path, capsys):
    cfg = _exp(tmp_path, text=SMALL.replace("seed: 0}", "seed: 0, zero_output: skip}"))
    _refused(capsys, ["run", cfg, "--no-save", "-q"], "zero_output: expected one of error, one")


# ---------------------------------------------------------------- vLLM's summary.json

def test_vllm_summary_json_one_object_per_point(tmp_path):
    cfg = _exp(tmp_path, "slo: {ttft_ms: 400}\n")
    assert run(["run", cfg, "--out", tmp_path / "o", "-q", "--summary-format", "vllm",
                 "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99.9"]) == 0
    lines = (tmp_path / "o" / "summary.json").read_text().splitlines()
    objs = [json.loads(x) for x in lines]
    assert len(objs) == 2
    for o in objs:
        assert o["backend"] == "simserve" and o["num_prompts"] == 60 and o["failed"] == 0
        assert o["burstiness"] == 1.0 and o["request_goodput"] is not None
        assert {"p50_ttft_ms", "p99.9_ttft_ms", "p99.9_e2el_ms", "std_e2el_ms"} <= set(o)
        assert not any(k.endswith("_itl_ms") or k.endswith("_tpot_ms") for k in o)
        assert o["p50_ttft_ms"] <= o["p99.9_ttft_ms"]
    s, _ = simserve.load_results(tmp_path / "o")  # simserve's readers take either form
    assert s["p99.9_ttft_ms"].tolist() == [o["p99.9_ttft_ms"] for o in objs]


def test_vllm_burstiness_is_the_gamma_shape(tmp_path):
    cfg = _exp(tmp_path, text=SMALL.replace("arrival: poisson", "arrival: gamma, "
                                            "burstiness_cv: 2.0"))
    assert run(["run", cfg, "--out", tmp_path / "o", "-q", "--summary-format", "vllm"]) == 0
    obj = json.loads((tmp_path / "o" / "summary.json").read_text().splitlines()[0])
    assert obj["burstiness"] == pytest.approx(0.25)  # CV = 1/sqrt(k)
    assert obj["request_goodput"] is None  # no SLO: vLLM writes null


@pytest.mark.parametrize("args, needle", [
    (["--summary-format", "vllm", "--metric-percentiles", "abc"], "--metric-percentiles"),
    (["--summary-format", "vllm", "--metric-percentiles", "100"], "between 0 and 100"),
    (["--summary-format", "vllm", "--percentile-metrics", "ttft,foo"], "subset of"),
    (["--metric-percentiles", "50"], "only with --summary-format vllm"),
])
def test_bad_vllm_summary_options_are_one_line(tmp_path, capsys, args, needle):
    _refused(capsys, ["run", _exp(tmp_path), "--no-save", "-q", *args], needle)


# ---------------------------------------------------------------- names `run` accepts

def test_capacity_bisect_takes_a_shipped_experiment_by_name(capsys):
    assert run(["capacity", "quickstart", "--bisect", "--target", "p99_ttft_ms<=400",
                 "--set", "workload.num_requests=80", "--tol", "0.2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and rows[0]["rate"] > 0


def test_capacity_unknown_name_is_one_line(capsys):
    _refused(capsys, ["capacity", "quickstar", "--bisect"], "did you mean 'quickstart'")


@pytest.mark.parametrize("name", ["synthetic-conversation", "random"])
def test_traces_stats_takes_synthetic_names(capsys, name):
    assert run(["traces", "stats", name, "--first", "50"]) == 0
    out = capsys.readouterr().out
    assert f"{name}: synthetic, 50 requests generated" in out and "input median" in out


@pytest.mark.parametrize("argv, needle", [
    (["traces", "stats", "synthetic-conversaton"], "did you mean"),
    (["traces", "stats", "azure-conv", "--rate", "3"], "--rate: only for a synthetic"),
    (["traces", "stats", "random", "--first", "0"], "num_requests"),
])
def test_traces_stats_bad_input_is_one_line(capsys, argv, needle):
    _refused(capsys, argv, needle)


# ---------------------------------------------------------------- regress on one's own folder

@pytest.fixture
def my_folder(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "chat.yaml").write_text(SMALL.replace("num_requests: 60", "num_requests: 40"))
    return d


def test_regress_own_folder_records_then_passes_then_names_the_moved_curve(my_folder, tmp_path,
                                                                           capsys):
    assert run(["regress", my_folder]) == 1  # no baseline yet
    assert run(["regress", my_folder, "--update"]) == 0
    assert (my_folder / "baselines" / "chat.json").is_file()
    assert run(["regress", my_folder, "--junit-xml", tmp_path / "ok.xml"]) == 0
    ok = ET.parse(tmp_path / "ok.xml").getroot()
    assert int(ok.get("tests")) >= 5 and ok.get("failures") == "0"
    text = (my_folder / "chat.yaml").read_text()
    (my_folder / "chat.yaml").write_text(text.replace("{name: vllm}",
                                                      "{name: vllm, max_num_batched_tokens: 128}"))
    assert run(["regress", my_folder, "--junit-xml", tmp_path / "moved.xml"]) == 1
    moved = ET.parse(tmp_path / "moved.xml").getroot()
    failed = [c for c in moved.iter("testcase") if c.find("failure") is not None]
    assert failed and all(c.get("classname") == "chat.vllm" for c in failed)
    assert "baseline" in failed[0].find("failure").text


@pytest.mark.parametrize("setup, needle", [
    (lambda d: (d / "regress.yaml").write_text("tolerances: [1, 2\n"), "not readable YAML"),
    (lambda d: (d / "regress.yaml").write_text("tolerances: {p99_ttft_ms: -1}\n"),
     "non-negative"),
    (lambda d: (d / "regress.yaml").write_text("targets: {chat: [p99<>3]}\n"), "target"),
    (lambda d: (d / "sweep.yaml").write_text(SMALL + "sweep: {workload.rates: [1]}\n"),
     "unknown key"),
    (lambda d: (d / "chat.yaml").unlink(), "no experiment YAMLs"),
])
def test_regress_bad_folder_is_one_line(my_folder, capsys, setup, needle):
    setup(my_folder)
    _refused(capsys, ["regress", my_folder], needle)


def test_regress_junit_into_a_missing_folder_is_one_line(my_folder, tmp_path, capsys):
    _refused(capsys, ["regress", my_folder, "--junit-xml", tmp_path / "no" / "r.xml"],
             "no such folder")
    _refused(capsys, ["regress", tmp_path / "nowhere"], "no such folder")


# ---------------------------------------------------------------- the Python API

N = 24
MINE = simserve.Workload(np.zeros(N), np.full(N, 400), np.full(N, 60), name="mine")


def _in_flight_max(q) -> int:
    ev = sorted([(a, 1) for a in q.arrival_s] + [(f, -1) for f in q.finish_s])
    level = peak = 0
    for _, d in ev:
        level += d
        peak = max(peak, level)
    return peak


def test_simulate_max_concurrency_with_my_workload_is_a_closed_loop():
    r = simserve.simulate(workload=MINE, max_concurrency=4)
    assert r.summary["max_concurrency"] == 4
    assert _in_flight_max(r.requests) == 4 and r.requests.arrival_s.max() > 0
    assert _in_flight_max(simserve.simulate(workload=MINE).requests) == N  # open loop


def test_simulate_num_requests_with_my_workload():
    assert simserve.simulate(workload=MINE, num_requests=10).summary["completed"] == 10
    with pytest.raises(ConfigError, match="only 24"):
        simserve.simulate(workload=MINE, num_requests=30)


def test_simulate_tile_and_start_with_my_workload():
    spaced = simserve.Workload(np.arange(N) * 0.5, MINE.prompt_tokens, MINE.output_tokens)
    r = simserve.simulate(workload=spaced, workload_options={"tile": 3})
    assert r.summary["num_requests"] == 3 * N and r.requests.arrival_s.max() > 3 * 0.5 * (N - 1)
    r = simserve.simulate(workload=spaced, workload_options={"start": 20})
    assert r.summary["num_requests"] == N - 20
    assert r.summary["request_rate"] == pytest.approx(2.0)  # the Workload's own mean rate


@pytest.mark.parametrize("kw, needle", [
    ({"max_concurrency": 0}, "max_concurrency: expected a positive integer"),
    ({"workload": MINE, "max_concurrency": 0}, "max_concurrency: expected a positive integer"),
    ({"workload": MINE, "rate": 3.0}, "rate: does not apply to a Workload"),
    ({"workload": MINE, "trace": "azure-conv"}, "trace: does not apply"),
    ({"workload": MINE, "workload_options": {"random_input_len": 5}}, "random_input_len"),
    ({"workload": MINE, "workload_options": {"tile": 0}}, "tile: expected a positive"),
])
def test_simulate_refuses_what_it_cannot_honour(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        simserve.simulate(**kw)


def test_run_experiment_with_my_workload_honours_the_options():
    cfg = {"model": "llama-3.1-8b", "policies": [{"name": "vllm"}],
           "workload": {"max_concurrency": 3, "num_requests": 12, "seeds": [0, 1]}}
    df = simserve.run_experiment(cfg, workload=MINE)
    assert df.completed.tolist() == [12, 12] and df.max_concurrency.tolist() == [3, 3]
    with pytest.raises(ConfigError, match="workload.rates: does not apply"):
        simserve.run_experiment({**cfg, "workload": {"rates": [3]}}, workload=MINE)


def test_helpers_take_run_experiments_dataframe(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from simserve import capacity, plots
    df = simserve.run_experiment(_exp(tmp_path))
    caps = capacity.grid_capacity(df, ["p99_ttft_ms<=100000"])
    assert len(caps) == 1 and caps[0].censored and caps[0].rate == 9.0
    assert plots.latency_vs_rate(df).get_lines()


def test_load_results_of_a_sweep_gathers_points_with_variant_columns(tmp_path):
    sweep = SMALL.replace("num_requests: 60", "num_requests: 30").replace(
        "rates: [3, 9]", "rates: [3]") + \
        "sweep:\n  policies.0.max_num_batched_tokens: [512, 2048]\n" \
        "variants:\n  a: {}\n  b: {hardware.gpu: h200-sxm}\n"
    assert run(["sweep", _exp(tmp_path, text=sweep), "--out", tmp_path / "s", "-q",
                 "--workers", "1"]) == 0
    s, q = simserve.load_results(tmp_path / "s")
    assert len(s) == 4 and len(q) == 4 * 30
    assert set(zip(q.variant, q["policies.0.max_num_batched_tokens"])) == \
        {("a", 512), ("a", 2048), ("b", 512), ("b", 2048)}
    assert q.groupby("point").size().tolist() == [30] * 4


def test_load_results_of_nothing_is_an_error(tmp_path):
    with pytest.raises(SimserveError, match="not a results folder"):
        simserve.load_results(tmp_path / "none")


# ---------------------------------------------------------------- a fresh clone

def test_trace_dir_set_hides_the_checkouts_shared_traces(tmp_path, monkeypatch):
    from simserve import paths
    from simserve.workload.manifest import trace_dirs
    from tests.traces import find_trace
    monkeypatch.setenv("SIMSERVE_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert paths.REPO_ROOT.parent / "shared" / "traces" not in trace_dirs()
    assert find_trace("azure-conv") is None  # so the tests that need it skip


def test_version_line_names_pure_python():
    import os
    import subprocess
    import sys
    env = {**os.environ, "SIMSERVE_PURE_PYTHON": "1"}  # a fresh process: nothing compiled
    out = subprocess.run([sys.executable, "-m", "simserve", "--version"], env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "pure Python" in out.stdout, out.stderr


def test_a_user_workloads_vllm_summary_has_no_poisson_burstiness(tmp_path):
    """A Workload's own arrivals are not Poisson: vLLM's summary gives no gamma shape."""
    cfg = {"model": "llama-3.1-8b", "policies": [{"name": "vllm"}], "workload": {}}
    w = simserve.Workload(np.array([0.0, 0.1, 2.0, 2.05]), np.full(4, 100), np.full(4, 8),
                          name="spread")
    simserve.run_experiment(cfg, workload=w, out=tmp_path / "o", summary_format="vllm")
    obj = json.loads((tmp_path / "o" / "summary.json").read_text().splitlines()[0])
    assert obj["burstiness"] is None
