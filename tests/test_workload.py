"""Workload package: readers on the shared traces, malformed input, generators, transforms,
manifest resolution and fetch (with a fake opener: no network)."""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import time
import urllib.error
from pathlib import Path

import numpy as np
import pandas  # noqa: F401  (the readers import it on first use; the timings below are the parse)
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.errors import ConfigError, SimserveError, TraceFormatError
from simserve.workload import (Workload, build_workload, cap_context, clear_trace_cache,
                               drop_overlong,
                               fetch_trace, first_n, gamma_arrivals, load_manifest,
                               lognormal_from_quantiles, normalize_exponential, read_azure_csv,
                               read_mooncake_jsonl, read_plain_csv, read_trace, resolve_trace,
                               scale_gaps, trace_stats)
from simserve.workload import build as build_mod
from simserve.workload import cli as wcli
from simserve.workload import manifest as mf
from simserve.workload.manifest import file_sha256
from tests.traces import trace_or_skip

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.traces  # many read the public traces (CI reruns them hidden)
AZ_CODE, AZ_CONV = "AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv"
MC_CONV, MC_SYN = "conversation_trace.jsonl", "synthetic_trace.jsonl"


def shared(name: str) -> Path:
    return trace_or_skip(name)


# -- readers on the shared traces ------------------------------------------------------------
# (file, reader, rows, first arrival_s/prompt/output, second arrival_s)
FIRST_ROWS = [
    (AZ_CODE, read_azure_csv, 8819, (0.0, 4808, 10), 0.052),
    (AZ_CONV, read_azure_csv, 19366, (0.0, 374, 44), 4.314579),
    (MC_CONV, read_mooncake_jsonl, 12031, (0.0, 6758, 500), 0.0),
    (MC_SYN, read_mooncake_jsonl, 3993, (0.0, 40160, 6), 0.0),
]


@pytest.mark.parametrize("name,reader,rows,first,second", FIRST_ROWS)
def test_shared_trace_rows(name, reader, rows, first, second):
    path = shared(name)
    t0 = time.perf_counter()
    w = reader(path)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0  # typically 20-60 ms; generous for loaded CI machines
    assert len(w) == rows and w.name == path.stem
    assert (w.arrival_s[0], w.prompt_tokens[0], w.output_tokens[0]) == first
    assert w.arrival_s[1] == pytest.approx(second, abs=1e-9)
    assert w.arrival_s.dtype == np.float64 and w.prompt_tokens.dtype == np.int64
    assert np.all(np.diff(w.arrival_s) >= 0) and w.output_tokens.min() >= 1
    same = read_trace(path)  # content sniffing picks the same reader
    assert np.array_equal(same.prompt_tokens, w.prompt_tokens)


# README statistics: requests, input mean, input median, input P95, output mean, duration
README_STATS = [
    (AZ_CODE, None, 8819, 2047.8, 1469, 7303.3, 27.9, 3435.9),
    (AZ_CONV, None, 19366, 1154.7, 1020, 4083, 211.1, 3501.7),
    (AZ_CONV, 2000, 2000, 1104.8, 1032, 4079, 264.9, 424.3),
    (MC_CONV, None, 12031, 12035.1, 6909, 39550.5, 342.6, 3537.0),
    (MC_SYN, None, 3993, 15325.5, 11587, 48904.6, 149.1, 1022.0),
]


@pytest.mark.parametrize("name,first,reqs,imean,imed,ip95,omean,dur", README_STATS)
def test_readme_statistics(name, first, reqs, imean, imed, ip95, omean, dur):
    w = read_trace(shared(name))
    if first:
        w = first_n(w, first)
    s = trace_stats(w)
    assert s["requests"] == reqs
    assert round(s["input_mean"], 1) == imean and round(s["output_mean"], 1) == omean
    assert round(s["input_median"], 1) == imed and round(s["input_p95"], 1) == ip95
    assert round(s["duration_s"], 1) == dur


def test_manifest_matches_shared_files():
    entries = load_manifest()
    assert {"azure-code", "azure-conv", "mooncake-conversation", "mooncake-synthetic",
            "mooncake-toolagent"} <= set(entries)
    assert entries["mooncake-toolagent"].size_bytes is None
    for e in entries.values():
        p = mf.find_local(e)
        if p is not None:
            assert p.stat().st_size == e.size_bytes and file_sha256(p) == e.sha256
            assert len(read_trace(p)) == e.requests


def test_mooncake_meta_counts_prefix_blocks():
    w = read_mooncake_jsonl(shared(MC_SYN))
    assert 0 < w.meta["num_prefix_blocks"] and w.meta["prefix_block_tokens"] == 512


# -- malformed input ---------------------------------------------------------------------------
AZ_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
AZ_ROW = "2023-11-16 18:17:03.9799600,4808,10\r\n"
PLAIN_HEAD = "arrival_s,prompt_tokens,output_tokens\n"
MC_ROW = '{"timestamp": 5, "input_length": 7, "output_length": 2}\n'

BAD = [
    ("a.csv", AZ_HEAD + AZ_ROW + "2023-11-16 18:17:04.1,12\r\n", 3, "missing field"),
    ("b.csv", AZ_HEAD + AZ_ROW + "\r\n2023-11-16 18:17:04.1,12.5,3\r\n", 4, "integer"),
    ("c.csv", AZ_HEAD + AZ_ROW + "2023-11-16 18:17:04.1,-3,3\r\n", 3, "negative"),
    ("d.csv", AZ_HEAD + AZ_ROW + "2023-11-16 18:17:04.1,0,3\r\n", 3, "prompt length of 0"),
    ("e.csv", AZ_HEAD + AZ_ROW + "2023-11-31 18:17:04.1,5,3\r\n", 3, "cannot parse"),
    ("f.csv", AZ_HEAD + AZ_ROW + "2023-11-16 18:17:02.0,5,3\r\n", 3, "backwards"),
    ("g.csv", AZ_HEAD + AZ_ROW + "2023-11-16 18:17:04.1,5,3,9\r\n", 3, "expected 3 fields"),
    ("h.csv", PLAIN_HEAD + "0,5,1\n1,x,1\n", 3, "integer"),
    ("i.csv", PLAIN_HEAD + "0,5,1\n2,5,1\n1,5,1\n", 4, "backwards"),
    ("j.csv", PLAIN_HEAD + "0,5,1\ninf,5,1\n", 3, "finite"),
    ("k.csv", PLAIN_HEAD + "0,5,1\n1,5,-1\n", 3, "negative"),
    ("l.csv", "arrival,prompt_tokens,output_tokens\n0,5,1\n", 1, "header"),
    ("a.jsonl", MC_ROW + "\n" + MC_ROW.replace('2}', '2.5}'), 3, "integer"),
    ("b.jsonl", MC_ROW + '{"timestamp": 6, "input_length": \n', 2, "invalid JSON"),
    ("c.jsonl", MC_ROW + MC_ROW.replace('"timestamp": 5', '"timestamp": 4'), 2, "backwards"),
    ("d.jsonl", MC_ROW + '{"timestamp": 6, "input_length": 7}\n', 2, "output_length"),
    ("e.jsonl", MC_ROW + MC_ROW.replace('"input_length": 7', '"input_length": 0'), 2,
     "prompt length of 0"),
]


@pytest.mark.parametrize("fname,text,line,fragment", BAD)
def test_malformed_rows_name_the_line(tmp_path, fname, text, line, fragment):
    p = tmp_path / fname
    p.write_bytes(text.encode())
    with pytest.raises(TraceFormatError) as exc:
        read_trace(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}:{line}:") and fragment in msg, msg


def test_zero_output_is_refused_by_line_or_counted_as_one_when_asked(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(PLAIN_HEAD + "0.5,5,3\n\n1.0,6,0\n")
    w = read_plain_csv(p)  # the reader keeps what the file says
    assert w.output_tokens.tolist() == [3, 0] and w.meta["num_zero_output"] == 1
    assert w.meta["first_zero_output_line"] == 4  # header 1, rows 2 and 4, a blank line 3
    assert w.arrival_s.tolist() == [0.5, 1.0]  # plain CSV arrivals are kept as written
    kw = {"num_requests": None, "arrival": "trace", "rate": None, "seed": 0}
    with pytest.raises(TraceFormatError, match=r"t\.csv:4: output length of 0 tokens"):
        build_workload(str(p), **kw)
    one = build_workload(str(p), zero_output="one", **kw)
    assert one.output_tokens.tolist() == [3, 1] and one.meta["num_zero_output"] == 1


# -- generators --------------------------------------------------------------------------------
def test_lognormal_quantile_fit():
    x = lognormal_from_quantiles(1020, 4083, 200_000, np.random.default_rng(1), lo=1)
    assert x.dtype == np.int64
    assert np.percentile(x, 50) == pytest.approx(1020, rel=0.02)
    assert np.percentile(x, 95) == pytest.approx(4083, rel=0.03)
    y = lognormal_from_quantiles(13, 90, 1000, np.random.default_rng(2), lo=6, hi=50)
    assert y.min() >= 6 and y.max() <= 50
    with pytest.raises(ConfigError):
        lognormal_from_quantiles(100, 50, 10, np.random.default_rng(0))


def test_gamma_arrivals_burstiness():
    a = gamma_arrivals(100_000, 4.0, 2.0, np.random.default_rng(3))
    gaps = np.diff(a)
    assert a[0] == 0 and gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)


# -- transforms --------------------------------------------------------------------------------
def _toy(n: int = 50, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(np.sort(rng.uniform(10, 100, n)), rng.integers(1, 5000, n),
                    rng.integers(1, 500, n), name="toy")


def test_normalize_exponential_exact_rate_same_gaps():
    w = _toy()
    a = normalize_exponential(w, 2.0, seed=7).arrival_s
    b = normalize_exponential(w, 5.0, seed=7).arrival_s
    assert a[0] == 0 and (len(a) - 1) / a[-1] == pytest.approx(2.0, rel=1e-12)
    assert (len(b) - 1) / b[-1] == pytest.approx(5.0, rel=1e-12)
    np.testing.assert_allclose(np.diff(a) * 2.0, np.diff(b) * 5.0, rtol=1e-12)
    assert not np.allclose(np.diff(normalize_exponential(w, 2.0, seed=8).arrival_s), np.diff(a))
    with pytest.raises(ConfigError):
        normalize_exponential(w, 0.0, seed=1)


def test_scale_gaps_preserves_ratios():
    w = _toy()
    s = scale_gaps(w, 3.0)
    assert s.arrival_s[0] == 0 and (len(s) - 1) / s.arrival_s[-1] == pytest.approx(3.0)
    np.testing.assert_allclose(np.diff(s.arrival_s) / np.diff(w.arrival_s),
                               (len(w) - 1) / (w.arrival_s[-1] - w.arrival_s[0]) / 3.0)
    with pytest.raises(ConfigError):
        scale_gaps(w, -1)


def test_first_n_errors():
    w = _toy(10)
    assert first_n(w, 3, start=7).prompt_tokens.tolist() == w.prompt_tokens[7:].tolist()
    for n, start in ((0, 0), (5, 6), (1, -1)):
        with pytest.raises(ConfigError):
            first_n(w, n, start)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10_000), st.integers(1, 10_000)), min_size=1,
                max_size=40), st.integers(2, 12_000))
def test_cap_context(pairs, max_context):
    p, o = (np.array(x, dtype=np.int64) for x in zip(*pairs))
    w = cap_context(Workload(np.zeros(len(p)), p, o), max_context)
    assert np.all(w.prompt_tokens + w.output_tokens <= max_context)
    assert w.prompt_tokens.min() >= 1 and w.output_tokens.min() >= 1
    over = p + o > max_context
    assert w.num_capped == int(over.sum())
    assert np.array_equal(w.prompt_tokens[~over], p[~over])
    assert np.array_equal(w.prompt_tokens, np.minimum(p, max_context - 1))


def test_drop_overlong_keeps_order_and_hash_ids():
    p = np.array([10, 90, 30, 100, 5], dtype=np.int64)
    o = np.array([5, 20, 1, 1, 95], dtype=np.int64)
    hids = tuple(np.array([i]) for i in range(5))
    w = drop_overlong(Workload(np.arange(5.0), p, o, hash_ids=hids), 100)
    assert w.num_dropped == 2 and w.num_capped == 0
    assert w.prompt_tokens.tolist() == [10, 30, 5] and w.arrival_s.tolist() == [0, 2, 4]
    assert [int(h[0]) for h in w.hash_ids] == [0, 2, 4]
    with pytest.raises(ConfigError, match="all 1 requests exceed"):
        drop_overlong(Workload(np.zeros(1), p[:1], o[:1] + 100), 100)


def test_mooncake_hash_ids_survive_first_n_and_drop():
    path = shared(MC_CONV)
    raw = read_mooncake_jsonl(path)
    assert len(raw.hash_ids) == len(raw) and raw.hash_block_tokens == 512
    assert all(len(h) == -(-int(p) // 512) for h, p in zip(raw.hash_ids, raw.prompt_tokens))
    w = build_workload(str(path), num_requests=300, arrival="poisson", rate=1.0, seed=0,
                       max_context=32768)
    over = int((raw.prompt_tokens[:300] + raw.output_tokens[:300] > 32768).sum())
    assert over > 0 and w.num_dropped == over and len(w) == 300 - over
    keep = np.flatnonzero(raw.prompt_tokens[:300] + raw.output_tokens[:300] <= 32768)
    assert all(np.array_equal(a, raw.hash_ids[i]) for a, i in zip(w.hash_ids, keep))
    assert (len(w) - 1) / w.arrival_s[-1] == pytest.approx(1.0)  # the kept ones at `rate`
    c = build_workload(str(path), num_requests=300, arrival="poisson", rate=1.0, seed=0,
                       max_context=32768, overlong="cap")
    assert len(c) == 300 and c.num_capped == over and c.num_dropped == 0
    with pytest.raises(ConfigError, match="overlong"):
        build_workload(str(path), num_requests=3, arrival="poisson", rate=1.0, seed=0,
                       max_context=32768, overlong="truncate")


# -- build -------------------------------------------------------------------------------------
def test_build_synthetic_same_requests_at_every_rate():
    a = build_workload("synthetic-code", num_requests=300, arrival="poisson", rate=1.0, seed=4)
    b = build_workload("synthetic-code", num_requests=300, arrival="poisson", rate=8.0, seed=4)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    np.testing.assert_allclose(a.arrival_s, b.arrival_s * 8.0, rtol=1e-12)
    c = build_workload("synthetic-code", num_requests=100, arrival="gamma", rate=1.0, seed=4,
                       burstiness_cv=3.0)
    assert np.array_equal(c.output_tokens, a.output_tokens[:100])
    with pytest.raises(ConfigError, match="synthetic"):
        build_workload("synthetic-code", num_requests=10, arrival="scale", rate=1.0, seed=0)
    with pytest.raises(ConfigError, match="did you mean 'poisson'"):
        build_workload("synthetic-code", num_requests=10, arrival="poison", rate=1.0, seed=0)


def test_dualpace_synthetic_matches_paper_means():
    """DualPace Fig. 8's means (1599/114 conversation, 2348/22 code) with the full-trace
    Azure shapes: same p95/p50 spread, every length scaled by one factor per side."""
    from simserve.workload.synthetic import SYNTHETIC, clipped_lognormal_mean
    for name, base, pm, om in (("synthetic-dualpace-conversation", "synthetic-conversation",
                                1599, 114),
                               ("synthetic-dualpace-code", "synthetic-code", 2348, 22)):
        s, b = SYNTHETIC[name], SYNTHETIC[base]
        assert s.prompt_mean == pytest.approx(pm, rel=1e-3)
        assert s.output_mean == pytest.approx(om, rel=2e-3)  # output bounds rounded to ints
        assert s.prompt_p95 / s.prompt_p50 == pytest.approx(b.prompt_p95 / b.prompt_p50)
        assert s.output_p95 / s.output_p50 == pytest.approx(b.output_p95 / b.output_p50)
        w = build_workload(name, num_requests=2000, arrival="poisson", rate=2.0, seed=0)
        assert w.prompt_tokens.mean() == pytest.approx(pm, rel=0.04)
        assert w.output_tokens.mean() == pytest.approx(om, rel=0.04)
        big = s.generate(200_000, 1)
        assert big.prompt_tokens.mean() == pytest.approx(pm, rel=0.01)
        assert big.output_tokens.mean() == pytest.approx(om, rel=0.02)
    # the clipped mean: no clipping gives the lognormal mean, a tight clip gives the bound
    assert clipped_lognormal_mean(100, 200) == pytest.approx(
        100 * np.exp(0.5 * (np.log(2) / 1.6448536269514722) ** 2))
    assert clipped_lognormal_mean(100, 200, lo=1, hi=2) == pytest.approx(2, rel=1e-9)


def test_dualpace_synthetic_precomputed_scales():
    """The precomputed DualPace factors are the ones `scaled_to_means` computes (bit for bit),
    so the specs equal what the module used to compute at import (with scipy)."""
    from simserve.workload.synthetic import DUALPACE_SCALES, SYNTHETIC
    for name, base, (pm, om), (kp, ko) in DUALPACE_SCALES:
        b = SYNTHETIC[base]
        assert (pm / b.prompt_mean, om / b.output_mean) == (kp, ko)
        assert SYNTHETIC[name] == b.scaled_to_means(name, pm, om, SYNTHETIC[name].source)


def test_build_trace_order_and_cache(monkeypatch, tmp_path):
    path = shared(AZ_CONV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty disk cache: one parse
    calls = []
    real = build_mod.read_trace
    monkeypatch.setattr(build_mod, "read_trace", lambda p: calls.append(p) or real(p))
    clear_trace_cache()
    kw = dict(num_requests=500, seed=1, start=100, max_context=1024, overlong="cap")
    t = build_workload(str(path), arrival="trace", rate=None, **kw)
    s = build_workload(str(path), arrival="scale", rate=2.0, **kw)
    assert len(calls) == 1
    raw = read_azure_csv(path)
    np.testing.assert_allclose(t.arrival_s, raw.arrival_s[100:600] - raw.arrival_s[100])
    assert (len(s) - 1) / s.arrival_s[-1] == pytest.approx(2.0)
    assert np.all(t.prompt_tokens + t.output_tokens <= 1024)
    assert t.num_capped == int((raw.prompt_tokens[100:600] + raw.output_tokens[100:600]
                                > 1024).sum()) > 0
    with pytest.raises(ConfigError, match="rate"):
        build_workload(str(path), arrival="poisson", rate=None, num_requests=5, seed=0)


# -- manifest: resolve and fetch ---------------------------------------------------------------
PAYLOAD = b"arrival_s,prompt_tokens,output_tokens\n0,5,1\n"


@pytest.fixture
def fake_manifest(tmp_path, monkeypatch):
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    man = tmp_path / "manifest.yaml"
    man.write_text(
        "traces:\n"
        + "".join(f"  {name}:\n    file: {name}.csv\n    url: https://example.invalid/{name}\n"
                  f"    sha256: '{digest}'\n    format: plain-csv\n    license: test\n"
                  f"    citation: test\n" for name, digest in
                  (("tiny", sha), ("tiny-badhash", "0" * 64))))
    monkeypatch.setattr(mf, "MANIFEST_PATH", man)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SIMSERVE_TRACE_DIR", str(tmp_path / "traces"))
    return tmp_path


def test_fetch_good_hash(fake_manifest):
    urls = []
    dest = fake_manifest / "dl"
    path = fetch_trace("tiny", dest, opener=lambda url, timeout: urls.append(url)
                       or io.BytesIO(PAYLOAD))
    assert path == dest / "tiny.csv" and path.read_bytes() == PAYLOAD
    assert urls == ["https://example.invalid/tiny"] and os.listdir(dest) == ["tiny.csv"]
    default = fetch_trace("tiny", opener=lambda url, timeout: io.BytesIO(PAYLOAD))
    assert default == fake_manifest / "cache" / "simserve" / "traces" / "tiny.csv"
    assert resolve_trace("tiny") == default  # the cache is one of the searched dirs


def test_fetch_bad_hash_leaves_nothing(fake_manifest):
    dest = fake_manifest / "dl"
    with pytest.raises(SimserveError, match="sha256"):
        fetch_trace("tiny-badhash", dest, opener=lambda url, timeout: io.BytesIO(PAYLOAD))
    assert os.listdir(dest) == []


def test_fetch_offline(fake_manifest):
    def offline(url, timeout):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    class Broken(io.BytesIO):
        def read(self, *a):
            raise ConnectionResetError("reset by peer")

    dest = fake_manifest / "dl"
    for opener in (offline, lambda url, timeout: Broken()):
        with pytest.raises(SimserveError, match="offline") as exc:
            fetch_trace("tiny", dest, opener=opener)
        assert "https://example.invalid/tiny" in str(exc.value)
        assert os.listdir(dest) == []
    with pytest.raises(SimserveError, match="did you mean 'tiny'"):
        fetch_trace("tinny", dest, opener=offline)


def test_resolve_trace_errors(fake_manifest):
    with pytest.raises(SimserveError) as exc:
        resolve_trace("tiny")
    msg = str(exc.value)
    assert "simserve traces fetch tiny" in msg and str(fake_manifest / "traces") in msg
    with pytest.raises(SimserveError, match="did you mean 'tiny'.*known: tiny, tiny-badhash"):
        resolve_trace("tinu")
    with pytest.raises(SimserveError, match="no such trace file"):
        resolve_trace(str(fake_manifest / "nope.csv"))
    (fake_manifest / "traces").mkdir()
    (fake_manifest / "traces" / "tiny.csv").write_bytes(PAYLOAD)
    assert resolve_trace("tiny") == fake_manifest / "traces" / "tiny.csv"


def test_cli_stats_and_list(fake_manifest, capsys):
    parser = argparse.ArgumentParser()
    wcli.register(parser.add_subparsers())
    (fake_manifest / "traces").mkdir()
    (fake_manifest / "traces" / "tiny.csv").write_bytes(PAYLOAD)
    for argv in (["traces", "stats", "tiny"], ["traces", "list"]):
        args = parser.parse_args(argv)
        assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "requests" in out and "tiny-badhash" in out and "missing" in out


def test_zero_output_applies_to_the_selected_requests_only(tmp_path):
    """`start` / `num_requests` / `tile` select requests first; only zero-output rows among them
    are refused (naming their own line) or counted."""
    p = tmp_path / "t.csv"
    p.write_text(PLAIN_HEAD + "0.5,5,0\n1.0,6,4\n\n1.5,7,0\n2.0,8,5\n")   # rows 0 and 2 are 0
    kw = {"arrival": "trace", "rate": None, "seed": 0}
    clean = build_workload(str(p), num_requests=1, start=1, **kw)   # row 1 alone: nothing to do
    assert clean.output_tokens.tolist() == [4] and not clean.meta["num_zero_output"]
    with pytest.raises(TraceFormatError, match=r"t\.csv:5: output length of 0 tokens \(1 "):
        build_workload(str(p), num_requests=2, start=1, **kw)   # rows 1-2: line 5, not 2
    one = build_workload(str(p), num_requests=3, start=1, zero_output="one", **kw)
    assert one.output_tokens.tolist() == [4, 1, 5] and one.meta["num_zero_output"] == 1
    # tiled twice, rows 3, 0 (copy 2), 1: the zero row of the second copy counts once
    tiled = build_workload(str(p), num_requests=3, start=3, tile=2, zero_output="one", **kw)
    assert tiled.output_tokens.tolist() == [5, 1, 4] and tiled.meta["num_zero_output"] == 1
    with pytest.raises(TraceFormatError, match=r"t\.csv:2: output length"):
        build_workload(str(p), num_requests=3, start=3, tile=2, **kw)
