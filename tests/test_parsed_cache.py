"""The disk cache of parsed inputs (`simserve.parsed_cache`): a cached parse equals a fresh one,
an edited file is parsed again, a damaged entry is ignored, the cache can be turned off, and a
`simserve run` whose inputs are cached imports no pandas."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from simserve import parsed_cache
from simserve.hardware import profile as hwprofile
from simserve.paths import shipped_profile_dir
from simserve.workload import build as wbuild
from simserve.workload.readers import read_trace

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SIMSERVE_PARSE_CACHE", raising=False)
    monkeypatch.setattr(hwprofile, "_PARSED", {})
    wbuild.clear_trace_cache()
    yield tmp_path / "xdg" / "simserve" / "parsed"
    wbuild.clear_trace_cache()


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.marshal")) if folder.exists() else []


def test_profile_from_cache_equals_yaml(cache):
    p = shipped_profile_dir() / "h100-sxm.yaml"
    fresh = yaml.safe_load(p.read_text())
    first = hwprofile._read_yaml(p)
    assert len(_entries(cache)) == 1
    hwprofile._PARSED.clear()  # a new process: only the disk cache is left
    second = hwprofile._read_yaml(p)
    assert first == fresh and second == fresh
    assert json.dumps(second) == json.dumps(fresh)  # same key order and types


def _trace(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    path.write_text("arrival_s,prompt_tokens,output_tokens\n"
                    + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    return path


def _same(a, b) -> None:
    for k in ("arrival_s", "prompt_tokens", "output_tokens"):
        x, y = getattr(a, k), getattr(b, k)
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert (a.name, a.meta, a.hash_ids, a.hash_block_tokens) == \
        (b.name, b.meta, b.hash_ids, b.hash_block_tokens)


def test_trace_from_cache_equals_reader_and_edits_miss(cache, tmp_path):
    f = _trace(tmp_path / "t.csv", [(0.0, 10, 2), (0.5, 20, 0), (1.25, 30, 4)])
    first = wbuild.load_trace(f)
    _same(first, read_trace(f.resolve()))
    wbuild.clear_trace_cache()
    second = wbuild.load_trace(f)
    _same(second, first)
    assert not second.arrival_s.flags.writeable
    _trace(f, [(0.0, 11, 2), (0.5, 20, 1)])  # edited: parsed again, not served stale
    wbuild.clear_trace_cache()
    third = wbuild.load_trace(f)
    assert third.prompt_tokens.tolist() == [11, 20] and len(_entries(cache)) == 2


def test_mooncake_hash_ids_survive_the_cache(cache, tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}\n'
                 '{"timestamp": 10, "input_length": 40, "output_length": 1, "hash_ids": [1]}\n')
    first = wbuild.load_trace(f)
    wbuild.clear_trace_cache()
    second = wbuild.load_trace(f)
    _same(second, first)
    assert second.hash_ids == ([1, 2], [1])


def test_damaged_entry_is_parsed_again(cache, tmp_path):
    f = _trace(tmp_path / "t.csv", [(0.0, 10, 2), (1.0, 20, 3)])
    first = wbuild.load_trace(f)
    (entry,) = _entries(cache)
    entry.write_bytes(entry.read_bytes()[:7])
    wbuild.clear_trace_cache()
    _same(wbuild.load_trace(f), first)
    wbuild.clear_trace_cache()
    _same(wbuild.load_trace(f), first)  # rewritten whole


def test_cache_off_writes_nothing(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("SIMSERVE_PARSE_CACHE", "0")
    f = _trace(tmp_path / "t.csv", [(0.0, 10, 2)])
    wbuild.load_trace(f)
    hwprofile._read_yaml(shipped_profile_dir() / "nvlink4.yaml")
    assert _entries(cache) == []


def test_unstorable_value_is_returned_uncached(cache, tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("x")
    v = parsed_cache.cached_parse(f, "test", lambda p: {"s": {1, 2}.__iter__()})
    assert v is not None and _entries(cache) == []


def test_cached_run_imports_no_pandas(tmp_path):
    """`simserve run` of a trace point with its inputs cached builds no DataFrame (the table
    needs none): pandas stays unimported."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(ROOT))
    env.pop("SIMSERVE_PARSE_CACHE", None)
    trace = _trace(tmp_path / "t.csv", [(0.1 * i, 50 + i, 3) for i in range(20)])
    code = ("import sys, json\nfrom simserve.cli import main\n"
            f"main(['run', 'quickstart', '--set', 'workload.trace={trace}', '--set', "
            "'workload.num_requests=20', '--set', 'workload.rates=[4]', '--no-save', '-q'])\n"
            "print(json.dumps('pandas' in sys.modules))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=tmp_path, env=env, check=True) for _ in range(2)]
    imported = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs]
    assert imported == [True, False]  # the first parses the CSV with pandas; the second not
    assert runs[0].stdout.splitlines()[1:-1] == runs[1].stdout.splitlines()[1:-1]


def test_a_changed_parser_misses(cache, tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("41")
    assert parsed_cache.cached_parse(f, "t", lambda p: int(p.read_text())) == 41
    # the same file read by a parser that does something else: not the stored value
    assert parsed_cache.cached_parse(f, "t", lambda p: int(p.read_text()) + 1) == 42
