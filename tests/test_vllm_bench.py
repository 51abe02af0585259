"""Workloads as `vllm bench serve` names them: the random dataset, `rates: [inf]`,
`max_concurrency` (a closed-loop client), `num_requests: null`, and tiled traces."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from helpers import H100, workload
from simserve.cli import main
from simserve.errors import ConfigError
from simserve.runner.config import parse_experiment
from simserve.runner.point import make_workload, run_point, points
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.run import simulate_point
from simserve.workload import build_workload
from tests.traces import trace_or_skip
from simserve.workload.synthetic import random_workload
from simserve.workload.transform import tile
from simserve.metrics import KEEP_UP_KEYS

BENCH = {"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
         "workload": {"trace": "random", "random_input_len": 1024, "random_output_len": 128,
                      "num_requests": 200, "rates": ["inf"], "max_concurrency": 16, "seed": 0},
         "policies": [{"name": "vllm"}]}


# ------------------------------------------------------------------------ random dataset

def test_random_lengths_are_vllms_uniform_integers():
    w = random_workload(4000, 10, 4, 0.5, seed=7)
    # [floor(L(1-r)), ceil(L(1+r))], both ends reached; outputs [2, 6]
    assert (w.prompt_tokens.min(), w.prompt_tokens.max()) == (5, 15)
    assert (w.output_tokens.min(), w.output_tokens.max()) == (2, 6)
    # one default_rng(seed) stream, prompts drawn first, as vLLM's RandomDataset does
    rng = np.random.default_rng(7)
    np.testing.assert_array_equal(w.prompt_tokens, rng.integers(5, 16, 4000))
    np.testing.assert_array_equal(w.output_tokens, rng.integers(2, 7, 4000))
    z = random_workload(50, 1024, 128, 0.0, seed=0)
    assert set(z.prompt_tokens) == {1024} and set(z.output_tokens) == {128}
    assert random_workload(300, 200, 1, 0.99, seed=0).output_tokens.min() == 1  # floor(0.01) -> 1


@pytest.mark.parametrize("kw, needle", [
    ({"range_ratio": 1.0}, "random_range_ratio"), ({"input_len": 0}, "random_input_len"),
    ({"output_len": 2.5}, "random_output_len")])
def test_random_bad_parameters(kw, needle):
    args = {"input_len": 8, "output_len": 8, "range_ratio": 0.0, **kw}
    with pytest.raises(ConfigError, match=needle):
        random_workload(4, seed=0, **args)


def test_infinite_rate_sends_everything_at_zero():
    w = build_workload("random", num_requests=30, arrival="poisson", rate=float("inf"), seed=0)
    assert not w.arrival_s.any() and w.meta["rate"] == "inf"
    cfg = parse_experiment(BENCH)
    assert cfg.workload.rates == (float("inf"),)
    assert cfg.resolved()["workload"]["random_range_ratio"] == 0.0  # vLLM's default filled in


def test_random_keys_only_with_the_random_trace():
    bad = json.loads(json.dumps(BENCH))
    bad["workload"]["trace"] = "synthetic-conversation"
    with pytest.raises(ConfigError, match="random_input_len: only for trace: random"):
        parse_experiment(bad)


def test_new_keys_at_defaults_keep_old_point_hashes():
    cfg = parse_experiment({**BENCH, "workload": {"trace": "synthetic-conversation"}})
    assert not {"max_concurrency", "tile", "random_input_len"} & set(cfg.resolved()["workload"])


# ------------------------------------------------------------------------ closed loop

def _in_flight_max(sent, finish):
    ev = np.concatenate([np.c_[sent, np.ones_like(sent)], np.c_[finish, -np.ones_like(finish)]])
    ev = ev[np.lexsort((ev[:, 1], ev[:, 0]))]  # a finish at t frees its slot before a send at t
    return int(np.cumsum(ev[:, 1]).max())


def test_max_concurrency_bounds_requests_in_flight_and_ttft_counts_from_send():
    cfg = parse_experiment(BENCH)
    res = run_point(cfg, points(cfg)[0])
    f = res.requests
    assert (f.scheduled_s == 0).all()
    assert _in_flight_max(f.arrival_s.to_numpy(), f.finish_s.to_numpy()) == 16
    assert (f.arrival_s.iloc[:16] == 0).all() and (f.arrival_s.iloc[16:] > 0).all()
    # every later request goes out at the moment some request finishes, in order
    assert np.isin(f.arrival_s.iloc[16:], f.finish_s).all()
    assert (np.diff(f.arrival_s) >= 0).all()
    np.testing.assert_array_equal(f.ttft_s, f.first_token_s - f.arrival_s)
    assert res.summary["max_concurrency"] == 16 and res.summary["request_rate"] == np.inf
    # open loop: all 200 at once queue at the server, so TTFT is far longer
    open_loop = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload,
                                                                      max_concurrency=None))
    assert run_point(open_loop, points(open_loop)[0]).summary["mean_ttft_ms"] > \
        3 * res.summary["mean_ttft_ms"]


def test_concurrency_limit_with_a_rate_is_a_fifo_semaphore():
    # arrivals follow the rate; a request waits until fewer than N are in flight
    w = build_workload("random", num_requests=120, arrival="poisson", rate=20.0, seed=1,
                       random_input_len=256, random_output_len=64, random_range_ratio=0.5,
                       max_concurrency=3)
    rec = simulate_point(w, "llama-3.1-8b", H100, "vllm").records
    sent, sched, fin = rec.arrival_s, rec.scheduled_s, rec.finish_s
    assert (sent >= sched).all() and (sent > sched).any()
    assert _in_flight_max(sent, fin) == 3
    assert (np.diff(sent) >= 0).all()  # FIFO
    waited = sent > sched
    assert np.isin(sent[waited], fin).all()  # a waiting request goes when a slot frees
    for i in np.flatnonzero(waited):  # ... and not before: N were in flight until then
        assert ((sent[:i] < sent[i]) & (fin[:i] >= sent[i])).sum() >= 3 - 1


CPU = {"cpu": "xeon-silver-4510", "cpu_cores": 12}


@pytest.mark.parametrize("policy, hwkw, params", [
    ("vllm", {}, {}), ("vllm", {"num_gpus": 2}, {}),
    ("sarathi", {"num_gpus": 2}, {"max_num_batched_tokens": 512}),
    ("neo", CPU, {}), ("dualpace", CPU, {})])
def test_closed_loop_leaping_matches_stepping(policy, hwkw, params):
    hw = resolve_hardware(HardwareConfig(gpu="h100-sxm", **hwkw))
    w = build_workload("random", num_requests=60, arrival="poisson", rate=30.0, seed=2,
                       random_input_len=300, random_output_len=80, random_range_ratio=0.9,
                       max_concurrency=5)
    a = simulate_point(w, "llama-3.1-8b", hw, policy, leap=True, **params)
    b = simulate_point(w, "llama-3.1-8b", hw, policy, leap=False, **params)
    for k in ("arrival_s", "token_times_s", "finish_s"):
        np.testing.assert_array_equal(getattr(a.records, k), getattr(b.records, k))
    assert _in_flight_max(a.records.arrival_s, a.records.finish_s) <= 5


def test_closed_loop_is_exact_when_engines_leap_past_a_finish():
    # below the limit, engines leap up to the next scheduled arrival and record finishes ahead
    # of the clock; the freed slot must count from the finish time, not from when the leap
    # was planned
    w = workload([0, 0, 1, 1, 1, 1, 1], [64] * 7, [400, 50, 400, 50, 400, 50, 30])
    w = dataclasses.replace(w, max_concurrency=3)
    a = simulate_point(w, "llama-3.1-8b", H100, "vllm")
    b = simulate_point(w, "llama-3.1-8b", H100, "vllm", leap=False)
    assert a.stats["num_iterations_stepped"] < 0.6 * b.stats["num_iterations_stepped"]  # leapt
    np.testing.assert_array_equal(a.records.token_times_s, b.records.token_times_s)
    rec = a.records
    assert rec.finish_s[1] < 1.0  # request 1 finished inside a leap, before the next arrivals
    np.testing.assert_array_equal(rec.arrival_s[:4], [0, 0, 1, 1])  # two slots free at t = 1
    assert np.isin(rec.arrival_s[4:], rec.finish_s).all()
    assert _in_flight_max(rec.arrival_s, rec.finish_s) == 3


def test_a_slot_freed_inside_a_leap_counts_from_the_finish_time():
    # A alone (1 in flight of 2) leaps to its last token, whose step straddles the arrival of
    # B and C at T: A's finish is recorded at plan time, before T, but its slot frees at its
    # finish time, after T; so B goes at T and C waits for A to finish
    solo = simulate_point(workload([0.0], [64], [50]), "llama-3.1-8b", H100, "vllm")
    t49, t50 = solo.records.token_times(0)[-2:]
    T = (t49 + t50) / 2
    w = dataclasses.replace(workload([0.0, T, T], [64] * 3, [50, 10, 10]), max_concurrency=2)
    a = simulate_point(w, "llama-3.1-8b", H100, "vllm")
    b = simulate_point(w, "llama-3.1-8b", H100, "vllm", leap=False)
    np.testing.assert_array_equal(a.records.token_times_s, b.records.token_times_s)
    assert a.records.finish_s[0] == t50
    np.testing.assert_array_equal(a.records.arrival_s, [0.0, T, t50])


def test_bad_max_concurrency_is_a_one_line_error(tmp_path, capsys):
    p = tmp_path / "x.yaml"
    p.write_text("model: llama-3.1-8b\nworkload: {trace: random, num_requests: 4, "
                 "max_concurrency: 0}\npolicies: [{name: vllm}]\n")
    assert main(["run", str(p), "--no-save", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "max_concurrency" in err and "x.yaml" in err


# ------------------------------------------------------------------------ traces

@pytest.mark.traces
def test_num_requests_null_is_the_whole_trace_and_tile_repeats_it_in_time():
    path = trace_or_skip("azure-code")
    whole = build_workload("azure-code", num_requests=None, arrival="trace", rate=None, seed=0)
    assert whole.num_requests == 8819
    t3 = build_workload(str(path), num_requests=None, arrival="trace", rate=None, seed=0, tile=3)
    n, a = whole.num_requests, whole.arrival_s
    period = (a[-1] - a[0]) * n / (n - 1)
    assert t3.num_requests == 3 * n
    np.testing.assert_allclose(t3.arrival_s[2 * n:], a + 2 * period)
    np.testing.assert_array_equal(t3.prompt_tokens[n:2 * n], whole.prompt_tokens)
    assert (np.diff(t3.arrival_s) >= 0).all()
    # the mean rate is the trace's own
    assert (3 * n - 1) / t3.arrival_s[-1] == pytest.approx((n - 1) / a[-1], rel=1e-3)
    with pytest.raises(ConfigError, match="tile"):
        build_workload("random", num_requests=5, arrival="poisson", rate=1.0, seed=0, tile=2)


def test_tile_of_simultaneous_arrivals_is_refused():
    with pytest.raises(ConfigError, match="no duration"):
        tile(workload([0.0, 0.0], [1, 1], [1, 1]), 2)


def test_make_workload_passes_the_vllm_keys():
    cfg = parse_experiment(BENCH)
    w = make_workload(cfg, float("inf"), 0)
    assert w.max_concurrency == 16 and set(w.prompt_tokens) == {1024}


# ------------------------------------------------------------------------ streamed records

@pytest.mark.parametrize("digest_process", ["0", "1"])
def test_streamed_run_writes_the_same_requests_and_summary(tmp_path, monkeypatch, digest_process):
    # "1": every point's chunks are digested and written by a child process (record_sink)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    monkeypatch.setenv("SIMSERVE_STREAM_PROCESS", digest_process)
    p = tmp_path / "s.yaml"
    p.write_text("model: llama-3.1-8b\nhardware: {gpu: h100-sxm, num_gpus: 2}\n"
                 "workload: {trace: synthetic-conversation, num_requests: 600, rates: [6, 9]}\n"
                 "policies: [{name: vllm}]\nslo: {ttft_ms: 300, tbt_ms: 40}\n")
    assert main(["run", str(p), "--out", str(tmp_path / "a"), "-q"]) == 0
    assert main(["run", str(p), "--out", str(tmp_path / "b"), "-q", "--stream"]) == 0
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "requests.csv").read_bytes() == (b / "requests.csv").read_bytes()
    ra, rb = json.loads((a / "summary.json").read_text()), json.loads((b / "summary.json").read_text())
    for x, y in zip(ra, rb):
        assert x.keys() == y.keys()
        for k in x:  # ITL mean/std are summed in another order; everything else is equal
            if k in KEEP_UP_KEYS:  # needs every token time: null in a streamed summary
                assert y[k] is None
                continue
            assert x[k] == y[k] or x[k] == pytest.approx(y[k], rel=1e-12), k


def test_streaming_table_keeps_a_bounded_ring_and_matches_the_full_one():
    from simserve.metrics import SLO, request_frame, summarize
    from simserve.metrics_stream import RecordStream
    w = build_workload("synthetic-conversation", num_requests=1500, arrival="poisson", rate=10.0,
                       seed=4, max_context=131072)
    full = simulate_point(w, "llama-3.1-8b", H100, "vllm")
    frames = []
    st = RecordStream(SLO(500, 50), frames.append, token_window=4096, chunk=64)
    res = simulate_point(w, "llama-3.1-8b", H100, "vllm", stream=st, progress=True)
    assert res.records is None and st.num_rows == 1500
    assert st.table.token_times.size < w.output_tokens.sum() / 2  # the ring, not every token
    import pandas as pd
    got = pd.concat(frames, ignore_index=True)
    want = request_frame(full.records, SLO(500, 50))
    assert got.to_csv(index=False) == want.to_csv(index=False)
    s, t = st.summary(), summarize(full.records, SLO(500, 50))
    skip = ("mean_itl_ms", "std_itl_ms", *KEEP_UP_KEYS)  # keep-up: not in a streamed summary
    assert {k: v for k, v in s.items() if k not in skip} == \
        {k: v for k, v in t.items() if k not in skip}
    assert s["mean_itl_ms"] == pytest.approx(t["mean_itl_ms"], rel=1e-12)


def test_strict_json_round_trip_through_the_capacity_loader(tmp_path):
    from simserve.capacity import load_records
    from simserve.runner.storage import write_records
    rec = {"policy": "vllm", "request_rate": float("inf"), "p99_itl_ms": float("nan"),
           "mean_ttft_ms": 12.5, "max_concurrency": None, "policy_options": {"x": 1.0}}
    write_records(tmp_path / "summary.json", [rec])
    text = (tmp_path / "summary.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in strict JSON"))
    assert '"request_rate": "inf"' in text and '"p99_itl_ms": null' in text
    back = load_records(tmp_path)[0]
    assert back["request_rate"] == float("inf") and np.isnan(back["p99_itl_ms"])
    assert back["max_concurrency"] is None and back["mean_ttft_ms"] == 12.5


def test_bisect_shows_a_bar_of_simulations(capsys):
    from simserve.capacity import parse_target
    from simserve.runner.bisect import bisect_experiment
    cfg = parse_experiment({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
                            "workload": {"trace": "random", "random_input_len": 256,
                                         "random_output_len": 32, "num_requests": 60,
                                         "rates": [2, 64]},
                            "policies": [{"name": "vllm"}]})
    rows, nsim = bisect_experiment(cfg, [parse_target("p99_ttft_ms<=200")], rtol=0.2,
                                   progress=True)
    err = capsys.readouterr().err
    assert nsim >= 2 and "bisect" in err and re.search(r"\d+sim", err.replace(" ", ""))


def test_python_api_takes_the_client_keys():
    import simserve
    r = simserve.simulate("vllm", trace="random", num_requests=40, rate=float("inf"),
                          max_concurrency=4, workload_options={"random_input_len": 256,
                                                               "random_output_len": 16})
    assert r.summary["max_concurrency"] == 4
    assert _in_flight_max(r.requests.arrival_s.to_numpy(), r.requests.finish_s.to_numpy()) == 4


def test_a_failing_digest_process_ends_the_run_with_its_error(tmp_path):
    from simserve.metrics import SLO
    from simserve.metrics_stream import RecordStream
    from simserve.runner.digest_process import DigestProcess
    w = build_workload("synthetic-conversation", num_requests=300, arrival="poisson", rate=10.0,
                       seed=4, max_context=131072)
    digest = DigestProcess(SLO(500, 50), tmp_path / "no-such-folder" / "requests.csv", True,
                           ("vllm", 10.0, 4))
    st = RecordStream(SLO(500, 50), digest=digest, token_window=4096, chunk=64)
    with pytest.raises(RuntimeError, match="digest process failed(.|\n)*no-such-folder"):
        simulate_point(w, "llama-3.1-8b", H100, "vllm", stream=st)
        st.summary()
    digest.close()
    assert digest._proc.poll() is not None  # the child is gone


def test_only_large_points_on_a_spare_core_get_a_digest_process(tmp_path, monkeypatch):
    from simserve.runner import record_sink
    monkeypatch.delenv("SIMSERVE_STREAM_PROCESS", raising=False)
    sink = record_sink.RecordSink(tmp_path / "r.csv")
    monkeypatch.setattr(record_sink, "_spare_core", lambda: True)
    assert sink.use_process(record_sink.PROCESS_MIN_REQUESTS)
    assert not sink.use_process(record_sink.PROCESS_MIN_REQUESTS - 1)
    monkeypatch.setattr(record_sink, "_spare_core", lambda: False)
    assert not sink.use_process(10 * record_sink.PROCESS_MIN_REQUESTS)
    monkeypatch.setenv("SIMSERVE_STREAM_PROCESS", "1")
    assert sink.use_process(1)
