"""Sweeps: grid expansion, range forms, strict errors, resume, atomic writes, worker counts
(Dask and Ray: test_executors.py)."""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.cli import main
from tests.sweep_helpers import pinned_date  # noqa: F401 (autouse fixture)
from tests.sweep_helpers import sweep as _sweep, tree as _tree
from simserve.errors import ConfigError
from simserve.runner import sweep_task
from simserve.runner.sweep import axis_values, load_sweep

SMALL = """\
name: small
model: llama-3.1-8b
hardware: {gpu: h100-sxm, num_gpus: 1}
workload: {trace: synthetic-conversation, num_requests: 120, arrival: poisson, seed: 3}
policies:
  - {name: vllm, max_num_batched_tokens: 2048}
  - {name: sarathi, max_num_batched_tokens: 512}
slo: {ttft_ms: 1000, tbt_ms: 100}
sweep:
  workload.rates: {range: [2, 6, 4]}
variants:
  base: {}
  big: {policies.0.max_num_batched_tokens: 4096}
"""
# 2 variants x 2 rates x 2 policies = 8 points; sarathi's points are the same in both
# variants, so 6 distinct simulations
N_POINTS, N_SIMS = 8, 6


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p




@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The SMALL sweep run once, uninterrupted, with two local worker processes."""
    tmp = tmp_path_factory.mktemp("ref")
    cfg = _write(tmp, SMALL)
    assert _sweep([cfg, "--out", tmp / "out", "--workers", 2]) == 0
    return tmp / "out"



# ------------------------------------------------------------------------- expansion

AXES = {
    "model": st.lists(st.sampled_from(["llama-3.1-8b", "qwen3-8b", "qwen3-14b"]),
                      min_size=1, max_size=3, unique=True),
    "hardware.num_gpus": st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3,
                                  unique=True),
    "policies.0.max_num_batched_tokens": st.one_of(
        st.lists(st.sampled_from([512, 1024, 2048, 4096]), min_size=1, max_size=3, unique=True),
        st.integers(1, 3).map(lambda k: {"range": [512, 512 * k, 512]})),
    "slo.tbt_ms": st.integers(1, 3).map(lambda n: {"linspace": [50, 150, n]}),
    "workload.num_requests": st.integers(1, 3).map(lambda n: {"geomspace": [100, 400, n]}),
    "workload.seeds": st.lists(st.integers(0, 5), min_size=1, max_size=2, unique=True),
}
VARIANTS = [{}, {"hardware.gpu": "h200-sxm"}, {"workload.arrival": "gamma"},
            {"slo.ttft_ms": 2000}]


@st.composite
def sweep_docs(draw):
    keys = draw(st.lists(st.sampled_from(sorted(AXES)), max_size=4, unique=True))
    pols = [{"name": "vllm", "label": "v", "max_num_batched_tokens": 2048},
            {"name": "sarathi", "label": "s"}][:draw(st.integers(1, 2))]
    doc = {"name": "h", "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
           "workload": {"trace": "synthetic-conversation", "num_requests": 100,
                        "rates": draw(st.lists(st.sampled_from([1, 2.5, 4]), min_size=1,
                                               max_size=3, unique=True)),
                        "seeds": draw(st.lists(st.integers(0, 3), min_size=1, max_size=2,
                                               unique=True))},
           "policies": pols, "slo": {"ttft_ms": 1000, "tbt_ms": 100}}
    if keys:
        doc["sweep"] = {k: draw(AXES[k]) for k in keys}
    n_var = draw(st.integers(0, len(VARIANTS)))
    if n_var:
        doc["variants"] = {f"v{i}": VARIANTS[i] for i in range(n_var)}
    return doc


def _resolved_at(resolved: dict, key: str):
    node = resolved
    for part in key.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=sweep_docs())
def test_grid_expansion_counts_and_reflects_values(doc):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        sweep = load_sweep(path)
    axes = {k: axis_values(v) for k, v in doc.get("sweep", {}).items()}
    n_seeds = 1 if "workload.seeds" in axes else len(doc["workload"]["seeds"])
    expected = math.prod(len(v) for v in axes.values()) * len(doc.get("variants", {None: 0})) \
        * len(doc["policies"]) * len(doc["workload"]["rates"]) * n_seeds
    assert len(sweep.points) == expected
    assert sweep.axes == tuple(axes)
    coords = set()
    for sp in sweep.points:
        r = sp.cfg.resolved()
        assert len(r["policies"]) == 1 and len(r["workload"]["rates"]) == 1 \
            and len(r["workload"]["seeds"]) == 1
        for key, value in sp.values:
            assert value in axes[key]
            if key == "workload.seeds":
                assert r["workload"]["seeds"] == [value]
            elif key.startswith("policies.0."):
                if sp.policy == doc["policies"][0]["label"]:
                    assert r["policies"][0][key.split(".")[-1]] == value
            else:
                assert _resolved_at(r, key) == value
        for key, value in (doc.get("variants") or {}).get(sp.variant, {}).items():
            assert _resolved_at(r, key) == value
        assert sp.rate in doc["workload"]["rates"]
        coords.add((sp.variant, sp.values, sp.policy, sp.rate, sp.seed))
    assert len(coords) == expected
    # one hash per distinct config: points differ unless a policies.0.* value is all that
    # tells them apart and the point is another policy's (that one simulation is shared)
    same = {}
    for sp in sweep.points:
        vals = tuple(kv for kv in sp.values if not (kv[0].startswith("policies.0.")
                                                     and sp.policy != doc["policies"][0]["label"]))
        same.setdefault((sp.variant, vals, sp.policy, sp.rate, sp.seed), set()).add(sp.key)
    assert all(len(keys) == 1 for keys in same.values())
    assert len({sp.key for sp in sweep.points}) == len(same)


RANGES = [
    ({"range": [4, 32, 4]}, [4, 8, 12, 16, 20, 24, 28, 32]),
    ({"range": [0, 10, 3]}, [0, 3, 6, 9]),             # stop off the grid: not included
    ({"range": [0, 5]}, [0, 1, 2, 3, 4, 5]),
    ({"range": [0.1, 0.5, 0.1]}, [0.1, 0.2, 0.3, 0.4, 0.5]),
    ({"range": [1, 2, 0.25]}, [1.0, 1.25, 1.5, 1.75, 2.0]),
    ({"range": [10, 2, -4]}, [10, 6, 2]),
    ({"range": [5, 5, 1]}, [5]),
    ({"linspace": [100, 300, 3]}, [100, 200, 300]),
    ({"linspace": [0, 1, 5]}, [0.0, 0.25, 0.5, 0.75, 1.0]),
    ({"linspace": [2.5, 2.5, 1]}, [2.5]),
    ({"geomspace": [1, 16, 5]}, [1, 2, 4, 8, 16]),
    ({"geomspace": [1, 1000, 4]}, [1, 10, 100, 1000]),
    ({"geomspace": [0.5, 2, 3]}, [0.5, 1.0, 2.0]),
    ([3, "a", 1.5], [3, "a", 1.5]),
]


@pytest.mark.parametrize("spec,values", RANGES)
def test_range_forms(spec, values):
    got = axis_values(spec)
    assert got == values
    assert [type(v) for v in got] == [type(v) for v in values]


@pytest.mark.parametrize("spec,needle", [
    ({"range": [1, 5, 0]}, "never gets"), ({"range": [5, 1, 1]}, "never gets"),
    ({"range": [1]}, "[start, stop, step]"), ({"range": [1, "x", 1]}, "of numbers"),
    ({"linspace": [1, 2, 0]}, "positive integer"), ({"geomspace": [0, 2, 3]}, "positive"),
    ({"rnage": [1, 2, 1]}, "did you mean 'range'"), ([], "empty"), ([1, 2, 1], "twice"),
    (5, "write [5]"), ({"range": [1, 2], "linspace": [1, 2, 3]}, "expected a list"),
])
def test_bad_range_forms(spec, needle):
    with pytest.raises(ConfigError) as exc:
        axis_values(spec, "f.yaml:3: sweep.x")
    assert needle in str(exc.value) and "f.yaml:3: sweep.x" in str(exc.value)


def test_set_overrides_sweep_and_variants(tmp_path):
    path = _write(tmp_path, SMALL)
    sweep = load_sweep(path, ["sweep.slo.tbt_ms=[50, 100]", "variants.fast.hardware.gpu=h200-sxm",
                              "workload.num_requests=50"])
    assert sweep.axes == ("workload.rates", "slo.tbt_ms")
    assert sweep.variants == ("base", "big", "fast")
    assert len(sweep.points) == 3 * 2 * 2 * 2
    assert {sp.cfg.workload.num_requests for sp in sweep.points} == {50}
    assert {sp.cfg.hardware.gpu for sp in sweep.points if sp.variant == "fast"} == {"h200-sxm"}


# ------------------------------------------------------------------------- bad input

BAD = [
    (SMALL.replace("workload.rates:", "workload.ratez:"),
     ["sweep.yaml:10", "workload.ratez", "did you mean 'workload.rate"]),
    (SMALL.replace("workload.rates:", "num_gpus: [1, 2]\n  workload.rates:"),
     ["sweep.yaml:10", "did you mean 'hardware.num_gpus'"]),
    (SMALL.replace("big: {policies.0.max_num_batched_tokens", "big: {policies.0.max_num_batched_tkns"),
     ["sweep.yaml:13", "did you mean 'max_num_batched_tokens'"]),
    (SMALL.replace("big: {policies.0.max", "big: {policies.5.max"),
     ["sweep.yaml:13", "policies.5", "0..1"]),
    (SMALL.replace("4096}", "-4}"), ["sweep.yaml:13", "positive integer", "variant=big"]),
    (SMALL.replace("{range: [2, 6, 4]}", "[2, -1]"), ["sweep.yaml:10", "positive"]),
    (SMALL.replace("{range: [2, 6, 4]}", "{range: [2, 6, 0]}"), ["sweep.yaml:10", "never gets"]),
    (SMALL.replace("big: {policies.0.max_num_batched_tokens: 4096}", "big: {hardware.gpu: h300}"),
     ["sweep.yaml:13", "h300", "variant=big"]),
    (SMALL.replace("variants:", "variant:"), ["sweep.yaml:11", "did you mean 'variants'"]),
    (SMALL.replace("big: {policies.0.max_num_batched_tokens: 4096}", "big: {workload.rates: [3]}"),
     ["sweep.yaml:13", "also swept"]),
    (SMALL.replace("synthetic-conversation", "/nonexistent/trace.csv"), ["/nonexistent/trace.csv"]),
]


@pytest.mark.parametrize("text,needles", BAD, ids=[n[-1][:30] for _, n in BAD])
def test_bad_sweep_is_a_clear_error_and_writes_nothing(tmp_path, capsys, text, needles):
    cfg = _write(tmp_path, text)
    for extra in ([], ["--dry-run"]):
        assert _sweep([cfg, "--out", tmp_path / "out", *extra]) == 2
        err = capsys.readouterr().err
        for n in needles:
            assert n in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.yaml"]


def test_refuses_a_folder_that_is_not_a_sweeps(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    assert _sweep([_write(tmp_path, SMALL), "--out", tmp_path / "out"]) == 2
    assert "refusing" in capsys.readouterr().err


# ------------------------------------------------------------------------- running

def test_results_layout_and_records(reference):
    recs = json.loads((reference / "summary.json").read_text())
    assert len(recs) == N_POINTS
    assert len(list((reference / "points").iterdir())) == N_SIMS
    assert [(r["variant"], r["workload.rates"], r["policy"]) for r in recs] == [
        (v, rate, p) for v in ("base", "big") for rate in (2, 6) for p in ("vllm", "sarathi")]
    for r in recs:
        assert r["request_rate"] == float(r["workload.rates"]) and r["seed"] == 3
        assert r["completed"] == 120
        for k in ("mean_ttft_ms", "p99_itl_ms", "median_tpot_ms", "request_throughput",
                  "output_throughput", "slo_attainment", "request_goodput", "duration"):
            assert k in r
        folder = reference / "points" / r["point"]
        one = json.loads((folder / "record.json").read_text())
        assert isinstance(one, list) and len(one) == 1 and one[0]["point"] == r["point"]
        assert f"sha256[:16] = {r['point']}" in (folder / "config.yaml").read_text()
        assert len((folder / "requests.csv").read_text().splitlines()) == 1 + 120
    header = (reference / "summary.csv").read_text().splitlines()[0].split(",")
    assert header[:7] == ["point", "variant", "workload.rates", "policy", "request_rate", "seed",
                          "num_requests"]
    # no temporary leftovers: the only hidden file is the marker
    assert [p.relative_to(reference).as_posix() for p in reference.rglob(".*")] == [".simserve.json"]
    # a recursive loader finds the top summary only, not each point a second time
    assert list(reference.rglob("summary.json")) == [reference / "summary.json"]


def test_points_written_before_record_json_are_reused_and_renamed(tmp_path, reference,
                                                                   monkeypatch):
    import shutil
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    for rec in (out / "points").glob("*/record.json"):
        rec.rename(rec.with_name("summary.json"))   # the layout before record.json
    (out / "summary.json").unlink()
    calls = _counting_run_point(monkeypatch)
    assert _sweep([_write(tmp_path, SMALL), "--out", out, "--workers", 1]) == 0
    assert calls == []
    assert _tree(out) == _tree(reference)


class Interrupt(KeyboardInterrupt):
    pass


REAL_RUN_POINT = sweep_task.run_point


def _counting_run_point(monkeypatch, fail_after: int | None = None) -> list:
    calls = []
    real = REAL_RUN_POINT

    def fake(cfg, pt, *a, **kw):
        if fail_after is not None and len(calls) >= fail_after:
            raise Interrupt()  # as if Ctrl-C arrived during this point
        calls.append(cfg.hash())
        return real(cfg, pt, *a, **kw)

    monkeypatch.setattr(sweep_task, "run_point", fake)
    return calls


def test_resume_after_interruption_runs_only_missing_points(tmp_path, reference, monkeypatch,
                                                            capsys):
    cfg, out = _write(tmp_path, SMALL), tmp_path / "out"
    calls = _counting_run_point(monkeypatch, fail_after=2)
    assert _sweep([cfg, "--out", out, "--workers", 1]) == 130
    assert len(calls) == 2
    assert sorted(p.name for p in (out / "points").iterdir()) == sorted(calls)
    # the summary holds exactly the points present; the marker says the sweep is partial
    assert sorted({r["point"] for r in json.loads((out / "summary.json").read_text())}) == \
        sorted(calls)
    marker = json.loads((out / ".simserve.json").read_text())
    assert (marker["complete"], marker["points_done"]) == (False, 2)
    capsys.readouterr()
    assert _sweep([cfg, "--out", out, "--dry-run"]) == 0
    listing = capsys.readouterr().out
    rows = [line.split() for line in listing.splitlines()[2:] if len(line.split()) == 7]
    assert len(rows) == N_POINTS
    assert all((row[1] == "done") == (row[0] in calls) for row in rows)
    assert f"2 done, {N_SIMS - 2} to run" in listing

    again = _counting_run_point(monkeypatch)
    assert _sweep([cfg, "--out", out, "--workers", 1]) == 0
    assert len(again) == N_SIMS - 2 and not set(again) & set(calls)
    assert _tree(out) == _tree(reference)  # as if never interrupted

    third = _counting_run_point(monkeypatch)
    assert _sweep([cfg, "--out", out, "--workers", 1]) == 0
    assert third == []


def test_temp_folders_are_not_finished_points(tmp_path, reference, monkeypatch, capsys):
    cfg, out = _write(tmp_path, SMALL), tmp_path / "out"
    keys = sorted(p.name for p in (reference / "points").iterdir())
    pdir = out / "points"
    pdir.mkdir(parents=True)
    (out / ".simserve.json").write_text('{"written_by": "simserve", "kind": "sweep"}')
    half = pdir / f".{keys[0]}.simserve-tmp-x1y2"     # a crash during write_point
    half.mkdir()
    (half / "summary.json").write_text("[")
    partial = pdir / keys[1]                # a folder missing files is not done either
    partial.mkdir()
    (partial / "config.yaml").write_text("x")
    assert _sweep([cfg, "--out", out, "--dry-run"]) == 0
    assert f"0 done, {N_SIMS} to run" in capsys.readouterr().out
    calls = _counting_run_point(monkeypatch)
    assert _sweep([cfg, "--out", out, "--workers", 1]) == 0
    assert len(calls) == N_SIMS
    assert not half.exists()
    assert _tree(out) == _tree(reference)


def test_a_failed_write_leaves_no_point_folder(tmp_path, monkeypatch, capsys):
    cfg, out = _write(tmp_path, SMALL), tmp_path / "out"

    def boom(*a, **kw):
        raise OSError("disk full")

    from simserve.runner import storage
    monkeypatch.setattr(storage.yaml, "safe_dump", boom)  # config.yaml is written last
    assert main(["sweep", str(cfg), "--out", str(out), "--workers", "1", "-q"]) == 2
    err = capsys.readouterr().err
    assert "disk full" in err and len(err.strip().splitlines()) == 1
    assert list((out / "points").iterdir()) == []


def test_one_and_two_workers_give_identical_results(tmp_path, reference):
    cfg = _write(tmp_path, SMALL)
    assert _sweep([cfg, "--out", tmp_path / "one", "--workers", 1]) == 0
    assert _tree(tmp_path / "one") == _tree(reference)


def test_a_refitted_profile_changes_the_point_key(tmp_path, monkeypatch):
    from simserve.runner.config import load_experiment
    from simserve.hardware.profile import profile_dirs
    cfg = load_experiment("quickstart")
    before = cfg.hash()
    assert cfg.hash() == before  # deterministic
    gpu = cfg.hardware.gpu
    text = (profile_dirs()[-1] / f"{gpu}.yaml").read_text()
    (tmp_path / f"{gpu}.yaml").write_text(text)
    monkeypatch.setenv("SIMSERVE_PROFILE_DIR", str(tmp_path))
    assert cfg.hash() == before  # same bytes, another folder: the same results
    (tmp_path / f"{gpu}.yaml").write_text(text.replace("iteration_us: 300.0", "iteration_us: 301.0"))
    assert "iteration_us: 300.0" in text and cfg.hash() != before
