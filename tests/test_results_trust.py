"""The results store: a folder is simserve's only when simserve made it (`.simserve.json`),
`run` and `sweep` never delete or replace what they did not write, and a stored sweep point is
reused only when its config, trace content, simserve version and code all match."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from simserve.cli import main
from simserve.runner import provenance, sweep_task
from simserve.runner.provenance import MARKER

TRACE_ROWS = "\n".join(f"{0.2 * i:.1f},{100 + 37 * i % 500},{10 + 7 * i % 60}" for i in range(40))
EXPERIMENT = """\
name: tiny
model: llama-3.1-8b
hardware: {gpu: h100-sxm}
workload: {trace: tr.csv, num_requests: 20, arrival: poisson, rates: [2], seed: 0}
policies:
  - {name: vllm, max_num_batched_tokens: 2048}
"""
SWEEP = EXPERIMENT.replace("rates: [2]", "rates: [2]").replace("name: tiny", "name: tinys") + \
    "sweep:\n  workload.rates: [2, 4]\n"


@pytest.fixture
def proj(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    (tmp_path / "tr.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + TRACE_ROWS + "\n")
    (tmp_path / "ex.yaml").write_text(EXPERIMENT)
    (tmp_path / "sw.yaml").write_text(SWEEP)
    return tmp_path


def run(*args) -> int:
    return main(["run", "ex.yaml", "-q", *map(str, args)])


def sweep(*args, file="sw.yaml") -> int:
    return main(["sweep", file, "-q", "--workers", "1", *map(str, args)])


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_error(capsys, *needles) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simserve: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


def user_files(folder: Path) -> dict[str, bytes]:
    """Files a user put in a results folder: a plot, a notebook, data."""
    (folder / "plots").mkdir(parents=True, exist_ok=True)
    (folder / "plots" / "latency.png").write_bytes(b"\x89PNG user plot")
    (folder / "analysis.ipynb").write_text('{"cells": []}')
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "mine.csv").write_text("a,b\n1,2\n")
    return {k: v for k, v in tree(folder).items()
            if k.startswith(("plots/", "data/")) or k == "analysis.ipynb"}


def kept(folder: Path, mine: dict) -> bool:
    now = tree(folder)
    return all(now.get(k) == v for k, v in mine.items())


# ------------------------------------------------------------------------ run --out

def test_run_writes_a_marker_with_what_the_results_are_made_from(proj):
    assert run("--out", "r") == 0
    m = json.loads((proj / "r" / MARKER).read_text())
    assert m["written_by"] == "simserve" and m["kind"] == "run" and m["complete"] is True
    assert m["simserve_version"] == provenance.simserve_version()
    from simserve.runner.config import load_experiment
    assert m["code_hash"] == provenance.point_code_hash(load_experiment("ex.yaml"))
    assert m["config_hash"] == (proj / "r" / "config.sha256").read_text().strip()
    want = hashlib.sha256((proj / "tr.csv").read_bytes()).hexdigest()
    assert list(m["traces"].values()) == [want]
    assert set(m["files"]) == {"summary.json", "summary.csv", "requests.csv", "config.yaml",
                               "config.sha256"}


def test_rerun_into_own_folder_keeps_the_users_files(proj):
    assert run("--out", "r") == 0
    mine = user_files(proj / "r")
    before = (proj / "r" / "summary.json").read_bytes()
    assert run("--out", "r", "--set", "workload.rates=[3]") == 0
    assert kept(proj / "r", mine)
    assert (proj / "r" / "summary.json").read_bytes() != before  # its own files replaced


def test_stream_rerun_keeps_the_users_files(proj):
    assert run("--out", "r") == 0
    mine = user_files(proj / "r")
    assert run("--out", "r", "--stream") == 0
    assert kept(proj / "r", mine) and (proj / "r" / "requests.csv").stat().st_size > 0


def test_folder_without_marker_is_refused_and_untouched(proj, capsys):
    mine = user_files(proj / "u")
    (proj / "u" / "summary.json").write_text("[]")  # looks like results, is not marked
    before = tree(proj / "u")
    assert run("--out", "u") == 2
    one_line_error(capsys, "u", "--overwrite", MARKER)
    assert tree(proj / "u") == before and kept(proj / "u", mine)


def test_overwrite_replaces_only_simserves_files(proj):
    mine = user_files(proj / "u")
    assert run("--out", "u", "--overwrite") == 0
    assert kept(proj / "u", mine)
    assert json.loads((proj / "u" / MARKER).read_text())["kind"] == "run"
    assert run("--out", "u") == 0  # now marked: a plain rerun is accepted


def test_overwrite_never_replaces_a_users_folder_of_a_simserve_name(proj, capsys):
    (proj / "u" / "requests.csv").mkdir(parents=True)
    (proj / "u" / "requests.csv" / "keep.txt").write_text("mine")
    assert run("--out", "u", "--overwrite") == 2
    one_line_error(capsys, "requests.csv")
    assert (proj / "u" / "requests.csv" / "keep.txt").read_text() == "mine"
    assert not (proj / "u" / MARKER).exists()


def test_an_unreadable_marker_counts_as_none(proj, capsys):
    user_files(proj / "u")
    (proj / "u" / MARKER).write_text("{not json")
    assert run("--out", "u") == 2
    one_line_error(capsys, MARKER)


def test_a_marker_listing_paths_outside_cannot_delete_them(proj):
    assert run("--out", "r") == 0
    victim = proj / "victim.txt"
    victim.write_text("mine")
    m = json.loads((proj / "r" / MARKER).read_text())
    m["files"] += ["../victim.txt", "..", "plots"]
    (proj / "r" / MARKER).write_text(json.dumps(m))
    mine = user_files(proj / "r")
    assert run("--out", "r", "--set", "workload.rates=[3]") == 0
    assert victim.read_text() == "mine"
    # "plots" was listed by hand: a name the run no longer writes is removed only when listed
    assert kept(proj / "r", {k: v for k, v in mine.items() if not k.startswith("plots/")})


def test_out_that_is_a_file_is_refused(proj, capsys):
    (proj / "f").write_text("x")
    assert run("--out", "f") == 2
    one_line_error(capsys, "f", "not a folder")
    assert (proj / "f").read_text() == "x"


def test_no_save_writes_nothing_and_checks_nothing(proj):
    before = user_files(proj / "u")
    assert run("--out", "u", "--no-save") == 0
    assert tree(proj / "u") == before


def test_run_into_a_sweep_folder_is_refused(proj, capsys):
    assert sweep("--out", "s") == 0
    before = tree(proj / "s")
    assert run("--out", "s") == 2
    one_line_error(capsys, "sweep", "--overwrite")
    assert tree(proj / "s") == before


def test_run_overwrite_of_a_sweep_folder_keeps_the_users_files(proj):
    assert sweep("--out", "s") == 0
    mine = user_files(proj / "s")
    assert run("--out", "s", "--overwrite") == 0
    assert kept(proj / "s", mine) and not (proj / "s" / "points").exists()
    assert json.loads((proj / "s" / MARKER).read_text())["kind"] == "run"


def test_api_refuses_a_folder_simserve_did_not_make(proj):
    from simserve.api import run_experiment
    from simserve.errors import SimserveError
    mine = user_files(proj / "u")
    with pytest.raises(SimserveError, match="did not make"):
        run_experiment("ex.yaml", out=proj / "u")
    assert kept(proj / "u", mine) and not (proj / "u" / MARKER).exists()


def test_api_overwrite_writes_beside_the_users_files(proj):
    from simserve.api import run_experiment
    mine = user_files(proj / "u")
    run_experiment("ex.yaml", out=proj / "u", overwrite=True)
    assert kept(proj / "u", mine) and (proj / "u" / MARKER).exists()
    assert (proj / "u" / "summary.json").exists()


# ---------------------------------------------------------------------------- sweep

def test_sweep_into_a_run_folder_is_refused(proj, capsys):
    assert run("--out", "r") == 0
    before = tree(proj / "r")
    assert sweep("--out", "r") == 2
    one_line_error(capsys, "run", "--overwrite")
    assert tree(proj / "r") == before


def test_sweep_into_a_users_folder_is_refused_then_overwrite_keeps_their_files(proj, capsys):
    mine = user_files(proj / "u")
    assert sweep("--out", "u") == 2
    one_line_error(capsys, "did not make")
    assert sweep("--out", "u", "--overwrite") == 0
    assert kept(proj / "u", mine) and len(json.loads((proj / "u" / "summary.json").read_text())) == 2


def test_sweep_keeps_the_users_files_on_resume(proj):
    assert sweep("--out", "s") == 0
    mine = user_files(proj / "s")
    assert sweep("--out", "s", "--set", "sweep.workload.rates=[2,4,6]") == 0
    assert kept(proj / "s", mine)


def test_overwrite_and_reuse_stale_together_are_refused(proj, capsys):
    assert sweep("--out", "s", "--overwrite", "--reuse-stale") == 2
    one_line_error(capsys, "--overwrite", "--reuse-stale")


def counting(monkeypatch) -> list[str]:
    """Count the simulations a sweep runs (in this process: --workers 1)."""
    calls = []
    real = sweep_task.run_point

    def counted(cfg, pt, *a, **kw):
        calls.append(cfg.hash())
        return real(cfg, pt, *a, **kw)

    monkeypatch.setattr(sweep_task, "run_point", counted)
    return calls


def point_provenance(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("points/*/provenance.json"))]


def test_resume_with_nothing_changed_runs_nothing(proj, monkeypatch):
    assert sweep("--out", "s") == 0
    calls = counting(monkeypatch)
    assert sweep("--out", "s") == 0
    assert calls == []


def test_changed_trace_content_reruns_its_points(proj, monkeypatch, capsys):
    assert sweep("--out", "s") == 0
    rows = (proj / "tr.csv").read_text().splitlines()
    rows[1] = "0.0,999,99"   # same path, same size class, other content
    (proj / "tr.csv").write_text("\n".join(rows) + "\n")
    calls = counting(monkeypatch)
    capsys.readouterr()
    assert sweep("--out", "s") == 0
    assert len(calls) == 2
    assert "2 trace file" in capsys.readouterr().err
    want = hashlib.sha256((proj / "tr.csv").read_bytes()).hexdigest()
    assert all(list(p["traces"].values()) == [want] for p in point_provenance(proj / "s"))


def test_changed_simserve_version_reruns_every_point(proj, monkeypatch, capsys):
    assert sweep("--out", "s") == 0
    monkeypatch.setattr(provenance, "simserve_version", lambda: "99.0.0")
    calls = counting(monkeypatch)
    capsys.readouterr()
    assert sweep("--out", "s") == 0
    assert len(calls) == 2 and "simserve version changed" in capsys.readouterr().err
    assert {p["simserve_version"] for p in point_provenance(proj / "s")} == {"99.0.0"}


def test_changed_code_reruns_every_point(proj, monkeypatch, capsys):
    assert sweep("--out", "s") == 0
    monkeypatch.setattr(provenance, "point_code_hash", lambda cfg: "0123456789abcdef")
    calls = counting(monkeypatch)
    capsys.readouterr()
    assert sweep("--out", "s") == 0
    assert len(calls) == 2 and "code changed" in capsys.readouterr().err


def test_code_edited_between_two_sweeps_of_one_process_reruns(proj, monkeypatch, capsys):
    """A notebook that sweeps, edits a module the points import, and sweeps again into the
    same folder reruns the points: the code is read anew for each sweep, not remembered."""
    import simserve.parsed_cache as pc
    assert sweep("--out", "s") == 0
    real = pc.closure_sources
    monkeypatch.setattr(pc, "closure_sources", lambda name: (
        *real(name), ("simserve.edited_in_a_notebook", None, b"X = 2\n")))
    calls = counting(monkeypatch)
    capsys.readouterr()
    assert sweep("--out", "s") == 0
    assert len(calls) == 2 and "code changed" in capsys.readouterr().err


def test_editing_a_policy_changes_the_code_hash(tmp_path):
    """The code hash covers every source file of the package: a copy with one policy edited
    hashes differently, an untouched copy the same."""
    import shutil
    import subprocess
    import sys
    src = Path(provenance.__file__).resolve().parents[1]
    copy = tmp_path / "pkg" / "simserve"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    code = "from simserve.runner.provenance import code_hash; print(code_hash())"

    def hash_of() -> str:
        env = {"PYTHONPATH": str(copy.parent), "PATH": "/usr/bin:/bin",
               "SIMSERVE_PURE_PYTHON": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              cwd=tmp_path,
                              text=True, check=True).stdout.strip()

    first = hash_of()
    assert hash_of() == first
    policy = next(copy.glob("policies/vllm*.py"))
    policy.write_text(policy.read_text() + "\n# edited\n")
    assert hash_of() != first


def test_a_plugin_packages_own_helper_module_is_in_its_code_hash(tmp_path, monkeypatch):
    """A policy plugin packaged as `myplug.engine` importing `myplug.knobs` (lazily too): an
    edit to the helper changes the modules hash of the plugin's module, so its points rerun."""
    import sys

    from simserve.runner.point_inputs import modules_hash
    pkg = tmp_path / "myplug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "knobs.py").write_text("BUDGET = 2048\n")
    (pkg / "lazy.py").write_text("FACTOR = 1.0\n")
    (pkg / "engine.py").write_text("from simserve.policies import base\n"
                                   "from myplug.knobs import BUDGET\n\n\n"
                                   "def build():\n    from . import lazy\n    return lazy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in [m for m in sys.modules if m.startswith("myplug")]:
        monkeypatch.delitem(sys.modules, m)
    __import__("myplug.engine")
    first = modules_hash(("myplug.engine",))
    modules_hash.cache_clear()
    (pkg / "knobs.py").write_text("BUDGET = 4096\n")
    second = modules_hash(("myplug.engine",))
    modules_hash.cache_clear()
    (pkg / "lazy.py").write_text("FACTOR = 2.0\n")
    third = modules_hash(("myplug.engine",))
    modules_hash.cache_clear()
    assert len({first, second, third}) == 3


def test_a_refitted_profile_changes_the_code_hash(tmp_path, monkeypatch):
    """A shipped profile edited, or one in the user's profile folder, makes stored points stale
    (the points read it; no stale result may be served)."""
    import shutil
    src = Path(provenance.__file__).resolve().parents[1]
    copy = tmp_path / "pkg" / "simserve"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    user = tmp_path / "profiles"
    user.mkdir()
    code = "from simserve.runner.provenance import code_hash; print(code_hash())"

    def hash_of() -> str:
        import subprocess
        import sys
        env = {"PYTHONPATH": str(copy.parent), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
               "SIMSERVE_PURE_PYTHON": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "SIMSERVE_PROFILE_DIR": str(user)}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              cwd=tmp_path, text=True, check=True).stdout.strip()

    first = hash_of()
    shipped = copy / "data" / "hwprofiles" / "h20.yaml"
    shipped.write_text(shipped.read_text() + "\n# refitted\n")
    second = hash_of()
    assert second != first
    (user / "my-gpu.yaml").write_text("name: my-gpu\n")
    assert hash_of() not in (first, second)


def test_reuse_stale_keeps_points_and_says_how_many_and_why(proj, monkeypatch, capsys):
    assert sweep("--out", "s") == 0
    monkeypatch.setattr(provenance, "simserve_version", lambda: "99.0.0")
    calls = counting(monkeypatch)
    capsys.readouterr()
    assert sweep("--out", "s", "--reuse-stale") == 0
    err = capsys.readouterr().err
    assert calls == [] and "reusing 2 stale point(s)" in err and "version changed" in err
    recs = json.loads((proj / "s" / "summary.json").read_text())
    assert all("version changed" in r["stale"] for r in recs)
    assert json.loads((proj / "s" / MARKER).read_text())["stale_reused"] == 2


def test_extending_a_stale_grid_never_mixes_old_and_new(proj, monkeypatch):
    assert sweep("--out", "s") == 0
    monkeypatch.setattr(provenance, "point_code_hash", lambda cfg: "fedcba9876543210")
    calls = counting(monkeypatch)
    assert sweep("--out", "s", "--set", "sweep.workload.rates=[2,4,6]") == 0
    assert len(calls) == 3  # the two stale points and the new one
    assert {p["code_hash"] for p in point_provenance(proj / "s")} == {"fedcba9876543210"}
    recs = json.loads((proj / "s" / "summary.json").read_text())
    assert len(recs) == 3 and not any("stale" in r for r in recs)


def test_extending_a_fresh_grid_runs_only_the_new_point(proj, monkeypatch):
    assert sweep("--out", "s") == 0
    calls = counting(monkeypatch)
    assert sweep("--out", "s", "--set", "sweep.workload.rates=[2,4,6]") == 0
    assert len(calls) == 1


def test_a_point_without_provenance_is_stale(proj, monkeypatch, capsys):
    assert sweep("--out", "s") == 0
    for p in (proj / "s").glob("points/*/provenance.json"):
        p.unlink()   # as an older simserve left it
    capsys.readouterr()
    assert sweep("--out", "s", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "stale" in out and "2 stale" in out
    calls = counting(monkeypatch)
    assert sweep("--out", "s") == 0
    assert len(calls) == 2


def test_an_interrupted_extension_leaves_a_consistent_partial_summary(proj, monkeypatch):
    assert sweep("--out", "s") == 0
    real = sweep_task.run_point
    done = []

    def stop_after_one(cfg, pt, *a, **kw):
        if done:
            raise KeyboardInterrupt
        done.append(cfg.hash())
        return real(cfg, pt, *a, **kw)

    monkeypatch.setattr(sweep_task, "run_point", stop_after_one)
    assert sweep("--out", "s", "--set", "sweep.workload.rates=[2,4,6,8]") == 130
    recs = json.loads((proj / "s" / "summary.json").read_text())
    present = {p.name for p in (proj / "s" / "points").iterdir()}
    assert {r["point"] for r in recs} == present and len(recs) == 3
    m = json.loads((proj / "s" / MARKER).read_text())
    assert (m["complete"], m["points_done"], m["points_total"]) == (False, 3, 4)


def test_the_summary_is_rewritten_after_every_point_slower_than_the_interval(proj,
                                                                            monkeypatch):
    from simserve.runner import sweep_store
    seen = []
    real = sweep_store.write_summaries

    def spy(out, records):
        seen.append(len(records))
        real(out, records)

    monkeypatch.setattr(sweep_store, "write_summaries", spy)
    t = [0.0]
    done = sweep_store.SummaryStore.done

    def slow_point(self, sp):   # each point takes 5 s (of this clock): past the interval
        t[0] += 5.0
        done(self, sp)

    monkeypatch.setattr(sweep_store, "_clock", lambda: t[0])
    monkeypatch.setattr(sweep_store.SummaryStore, "done", slow_point)
    assert sweep("--out", "s", "--set", "sweep.workload.rates=[2,4,6]") == 0
    assert seen == [0, 1, 2, 3, 3]


def test_sweep_overwrite_of_a_run_folder_keeps_the_users_files(proj):
    assert run("--out", "r") == 0
    mine = user_files(proj / "r")
    assert sweep("--out", "r", "--overwrite") == 0
    assert kept(proj / "r", mine)
    assert not (proj / "r" / "requests.csv").exists()   # the run's own files went
    assert json.loads((proj / "r" / MARKER).read_text())["kind"] == "sweep"


def test_sweep_overwrite_reruns_every_point(proj, monkeypatch):
    assert sweep("--out", "s") == 0
    calls = counting(monkeypatch)
    assert sweep("--out", "s", "--overwrite") == 0
    assert len(calls) == 2


def test_a_foreign_marker_file_lists_nothing_to_replace(proj):
    mine = user_files(proj / "u")
    (proj / "u" / MARKER).write_text(json.dumps({"kind": "run", "files": ["data", "plots"]}))
    assert run("--out", "u", "--overwrite") == 0
    assert kept(proj / "u", mine)


def test_a_hand_edited_sweep_marker_cannot_remove_the_folder_or_its_parent(proj):
    """--overwrite of a run folder by a sweep removes only plain names the old marker lists."""
    assert run("--out", "r") == 0
    marker = proj / "r" / MARKER
    m = json.loads(marker.read_text())
    m["files"] = m["files"] + ["..", ".", ""]
    marker.write_text(json.dumps(m))
    (proj / "keep.txt").write_text("mine")
    assert sweep("--out", "r", "--overwrite") == 0
    assert (proj / "keep.txt").read_text() == "mine" and (proj / "r" / "points").is_dir()


def _package_copy(tmp_path: Path) -> Path:
    import shutil
    src = Path(provenance.__file__).resolve().parents[1]
    copy = tmp_path / "pkg" / "simserve"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    return copy


POINT_HASHES = """
from simserve.runner.config import parse_experiment
from simserve.runner.point_inputs import point_code_hash

def cfg(policy, **opts):
    return parse_experiment({"name": "x", "model": "llama-3.1-8b",
                             "hardware": {"gpu": "h100-sxm", "num_gpus": 2},
                             "workload": {"trace": "synthetic-conversation", "num_requests": 9,
                                          "rates": [1]},
                             "policies": [{"name": policy, **opts}]}, "<test>")

print(point_code_hash(cfg("vllm")), point_code_hash(cfg("distserve", decode_gpu="h20")),
      point_code_hash(cfg("conflux")))
"""


def test_a_points_code_hash_covers_what_its_simulation_reads_and_nothing_else(tmp_path):
    """Editing the planner or `explain/` keeps every point fresh; editing a policy makes its
    points stale and no other's; editing the simulation core makes every point stale; a
    refitted decode-pool profile (distserve's `decode_gpu`) makes the points that use it
    stale."""
    import subprocess
    import sys
    copy = _package_copy(tmp_path)

    def hashes() -> list[str]:
        env = {"PYTHONPATH": str(copy.parent), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
               "SIMSERVE_PURE_PYTHON": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "SIMSERVE_PARSE_CACHE": "0"}
        return subprocess.run([sys.executable, "-c", POINT_HASHES], env=env, cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.split()

    def edit(rel: str) -> None:
        f = copy / rel
        f.write_text(f.read_text() + "\n# edited\n")

    vllm, dist, conflux = base = hashes()
    assert len(set(base)) == 3
    edit("plan/space.py")
    edit("explain/report.py")
    assert hashes() == base
    edit("policies/conflux/engine.py")
    assert hashes()[:2] == [vllm, dist] and hashes()[2] != conflux
    edit("data/hwprofiles/h20.yaml")   # the decode pool's GPU only
    after = hashes()
    assert after[0] == vllm and after[1] != dist
    edit("sim/cluster.py")
    assert all(a != b for a, b in zip(hashes(), after))


def test_every_reader_of_package_data_is_in_the_point_hash_table():
    """A module reading a package data folder (`paths.data_dir`) is listed in
    `point_inputs.DATA_READERS`, so points that import it rerun when that data changes."""
    from simserve.runner.point_inputs import DATA_READERS
    root = Path(provenance.__file__).resolve().parents[1]
    # paths defines data_dir (its profile and experiment folders are hashed per profile file
    # and by the config hash); point_inputs hashes the folders of the readers listed
    exempt = {"simserve.paths", "simserve.runner.point_inputs"}
    readers = set()
    for p in root.rglob("*.py"):
        if "data_dir(" in p.read_text():
            rel = p.relative_to(root.parent).with_suffix("")
            readers.add(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    assert readers - exempt - set(DATA_READERS) == set()
