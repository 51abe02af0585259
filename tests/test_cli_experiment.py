"""The experiment runner from the command line: results, determinism and bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simserve.cli import main
from tests.traces import trace_or_skip

REPO = Path(__file__).resolve().parents[1]

SMALL = """\
name: small
model: llama-3.1-8b
hardware: {gpu: h100-sxm, num_gpus: 1}
workload: {trace: synthetic-conversation, num_requests: 200, arrival: poisson, rates: [2, 6], seed: 3}
policies:
  - {name: vllm, max_num_batched_tokens: 2048}
  - {name: sarathi, max_num_batched_tokens: 512}
slo: {ttft_ms: 1000, tbt_ms: 100}
"""


def _write(tmp_path, text, name="exp.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_run_writes_results_and_is_deterministic(tmp_path, capsys, monkeypatch):
    cfg = _write(tmp_path, SMALL)
    # the run date is the only field that changes between reruns; SOURCE_DATE_EPOCH pins it
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "-q"]) == 0
    assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "TTFT mean s" in out and "sarathi" in out
    assert "units: TTFT, ITL, TPOT in s" in out and "SLO: deadlines" in out
    a = (tmp_path / "a" / "summary.json").read_bytes()
    assert a == (tmp_path / "b" / "summary.json").read_bytes()
    assert b"NaN" not in a and b"Infinity" not in a
    recs = json.loads(a)
    for r in recs:
        assert r["date"] == "20231114-221320"
        assert (r["model"], r["gpu"], r["num_gpus"]) == ("llama-3.1-8b", "h100-sxm", 1)
        assert r["policy_options"]["block_size"] == 16 and r["policy_name"] == r["policy"]
    assert len(recs) == 4
    assert {(r["policy"], r["request_rate"], r["seed"]) for r in recs} == {
        ("vllm", 2.0, 3), ("vllm", 6.0, 3), ("sarathi", 2.0, 3), ("sarathi", 6.0, 3)}
    for r in recs:
        assert r["completed"] == 200
        for k in ("mean_ttft_ms", "p99_itl_ms", "median_tpot_ms", "p90_e2el_ms",
                  "request_throughput", "output_throughput", "total_token_throughput",
                  "mean_normalized_latency_s", "slo_attainment", "request_goodput", "duration"):
            assert k in r
    lines = (tmp_path / "a" / "requests.csv").read_text().splitlines()
    assert len(lines) == 1 + 4 * 200
    assert (tmp_path / "a" / "config.sha256").read_text().strip() in \
        (tmp_path / "a" / "config.yaml").read_text()


def test_set_overrides_and_rerun_replaces_results(tmp_path):
    cfg = _write(tmp_path, SMALL)
    out = tmp_path / "r"
    assert main(["run", str(cfg), "--out", str(out), "-q", "--set", "workload.rates=[1]",
                 "--set", "policies.0.max_num_batched_tokens=4096"]) == 0
    recs = json.loads((out / "summary.json").read_text())
    assert [r["request_rate"] for r in recs] == [1.0, 1.0]
    assert "max_num_batched_tokens: 4096" in (out / "config.yaml").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".r.")]


BAD = [
    (SMALL.replace("rates:", "ratez:"), ["exp.yaml:4", "ratez", "did you mean 'rates'"]),
    (SMALL.replace("rates: [2, 6]", "rates: [2, -1]"), ["exp.yaml:4", "positive"]),
    (SMALL.replace("synthetic-conversation", "/nonexistent/trace.csv"),
     ["/nonexistent/trace.csv"]),
    (SMALL.replace("llama-3.1-8b", "llama-3.1-9b"), ["exp.yaml:2", "did you mean 'llama-3.1-8b'",
                                                    "qwen3-14b"]),
    (SMALL.replace("h100-sxm", "h300"), ["hardware.gpu", "h100-sxm", "rtx4090"]),
    (SMALL.replace("name: sarathi, max", "name: sarathi, maxx_num_seqs: 4, max"),
     ["exp.yaml:7", "maxx_num_seqs", "did you mean 'max_num_seqs'"]),
    (SMALL.replace("policies:", "polices:"), ["did you mean 'policies'"]),
]


@pytest.mark.parametrize("text,needles", BAD)
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, capsys, text, needles):
    cfg = _write(tmp_path, text)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    for n in needles:
        assert n in err, err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["exp.yaml"]


def test_malformed_trace_row_names_its_line(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n0.5,abc,10\n")
    cfg = _write(tmp_path, SMALL.replace("synthetic-conversation", str(trace))
                 .replace("arrival: poisson", "arrival: trace"))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "t.csv:3" in err
    assert not (tmp_path / "o").exists()


def test_request_longer_than_kv_pool_is_refused(tmp_path, capsys):
    cfg = _write(tmp_path, SMALL.replace("max_num_batched_tokens: 2048}",
                                         "max_num_batched_tokens: 2048, num_gpu_blocks_override: 8}"))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "-q"]) == 2
    assert "KV" in capsys.readouterr().err


@pytest.mark.traces
def test_manifest_trace_name_resolves_under_trace_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMSERVE_TRACE_DIR", str(trace_or_skip("azure-conv").parent))
    cfg = _write(tmp_path, SMALL.replace("synthetic-conversation", "azure-conv"))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "-q",
                 "--set", "workload.rates=[4]", "--set", "workload.num_requests=100"]) == 0
    recs = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert recs[0]["completed"] == 100


@pytest.mark.parametrize("key, value, says", [
    ("num_requests", 5, "workload.num_requests: asked for requests 0..4 but t has only 4"),
    ("start", 9, "workload.start: 9 is past the end of t (4 requests)")])
def test_a_selection_past_the_trace_names_the_file_line_and_key(tmp_path, capsys, key, value,
                                                               says):
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n"
                                    + "".join(f"{i},10,5\n" for i in range(4)))
    text = ("name: z\nmodel: llama-3.1-8b\nhardware: {gpu: h100-sxm}\nworkload:\n"
            f"  trace: {tmp_path / 't.csv'}\n  rates: [2]\n  {key}: {value}\n"
            "policies:\n  - name: vllm\n")
    assert main(["run", str(_write(tmp_path, text)), "--no-save", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"simserve: error: {tmp_path / 'exp.yaml'}:7: {says}"], err
