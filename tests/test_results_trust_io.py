"""Results a user can trust, continued: experiment names that would leave `results/`, write
errors (a full disk, permissions, a read-only folder) as one-line errors with nothing
half-written, locks through symlinks, leftovers of killed runs, and the parse cache (keyed by
the reader's whole code, pruned by size, `simserve cache`)."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simserve import parsed_cache
from simserve.cli import main
from simserve.runner import storage
from simserve.runner.provenance import MARKER
from tests.test_results_trust import kept, one_line_error, proj, run, sweep, tree, user_files

__all__ = ["proj"]  # the fixture, shared
REPO = Path(__file__).resolve().parents[1]
_CLOSURE = parsed_cache.source_closure


# ------------------------------------------------------------------------------ names

@pytest.mark.parametrize("name", ["../../x", "/abs/x", "a/b", "..", "a\\\\b", "."])
def test_a_name_that_is_a_path_is_refused_at_its_line(proj, capsys, name):
    text = (proj / "ex.yaml").read_text().replace("name: tiny", f"name: '{name}'")
    (proj / "ex.yaml").write_text(text)
    assert main(["run", "ex.yaml", "-q"]) == 2
    one_line_error(capsys, "ex.yaml:1: name:")
    assert sorted(p.name for p in proj.iterdir()) == ["ex.yaml", "sw.yaml", "tr.csv"]
    assert not (proj.parent / "x").exists()


def test_a_sweep_name_that_is_a_path_is_refused(proj, capsys):
    text = (proj / "sw.yaml").read_text().replace("name: tinys", "name: ../../escape")
    (proj / "sw.yaml").write_text(text)
    assert sweep() == 2
    one_line_error(capsys, "sw.yaml:1: name:", "path separator")
    assert not (proj.parent.parent / "escape-sweep").exists()


def test_a_name_set_on_the_command_line_is_checked_too(proj, capsys):
    assert main(["run", "ex.yaml", "-q", "--set", "name=../up"]) == 2
    one_line_error(capsys, "name:", "'../up'")


def test_a_plain_name_with_dots_is_accepted(proj):
    assert main(["run", "ex.yaml", "-q", "--set", "name=v1.2-run"]) == 0
    assert (proj / "results" / "v1.2-run" / MARKER).is_file()


# ----------------------------------------------------------------------- write errors

def _cli(proj: Path, args: list[str], fsize: int | None = None) -> subprocess.CompletedProcess:
    """simserve in a child process, its file size limit at `fsize` bytes (`ulimit -f`: writes
    past it fail with EFBIG, as on a full disk)."""
    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    env = {**os.environ, "PYTHONPATH": str(REPO), "SIMSERVE_PURE_PYTHON": "1",
           "SIMSERVE_PARSE_CACHE": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "simserve", *args], cwd=proj, env=env,
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=limit if fsize else None)


def _one_line(res: subprocess.CompletedProcess, *needles) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*") if storage.TMP in p.name or storage.OLD in p.name)


def test_a_full_disk_during_run_leaves_no_results_folder(proj):
    res = _cli(proj, ["run", "ex.yaml", "-q", "--out", "r"], fsize=1500)
    _one_line(res, "--out r", "cannot write")
    assert not (proj / "r").exists() and _leftovers(proj) == []


def test_a_full_disk_during_rerun_leaves_the_old_results(proj):
    assert run("--out", "r") == 0
    mine = user_files(proj / "r")
    before = tree(proj / "r")
    res = _cli(proj, ["run", "ex.yaml", "-q", "--out", "r", "--set", "workload.rates=[3]"],
               fsize=1500)
    _one_line(res, "cannot write")
    assert tree(proj / "r") == before and kept(proj / "r", mine) and _leftovers(proj) == []


def test_a_full_disk_during_sweep_leaves_no_half_point(proj):
    res = _cli(proj, ["sweep", "sw.yaml", "-q", "--workers", "1", "--out", "s"], fsize=1500)
    _one_line(res, "cannot write")
    assert _leftovers(proj) == []
    points = sorted(p.name for p in (proj / "s" / "points").iterdir()) \
        if (proj / "s" / "points").is_dir() else []
    recs = json.loads((proj / "s" / "summary.json").read_text())
    assert sorted(r["point"] for r in recs) == points  # the summary matches what is there


def denied(parent, prefix):
    """`storage._fresh_dir` on a folder the user may not write into."""
    raise PermissionError(errno.EACCES, "Permission denied", str(parent))


def test_permission_denied_is_one_line(proj, capsys, monkeypatch):
    monkeypatch.setattr(storage, "_fresh_dir", denied)
    assert run("--out", "r") == 2
    one_line_error(capsys, "Permission denied")
    assert not (proj / "r").exists()


def test_a_read_only_folder_is_one_line_and_leaves_the_results(proj, capsys, monkeypatch):
    assert run("--out", "r") == 0
    before = tree(proj / "r")

    def read_only(src, dst):
        raise OSError(errno.EROFS, "Read-only file system", str(dst))
    monkeypatch.setattr(os, "replace", read_only)
    assert run("--out", "r", "--set", "workload.rates=[3]") == 2
    monkeypatch.undo()
    one_line_error(capsys, "Read-only file system")
    assert tree(proj / "r") == before and _leftovers(proj) == []


def test_an_unwritable_sweep_folder_is_one_line(proj, capsys, monkeypatch):
    monkeypatch.setattr(storage, "_fresh_dir", denied)
    assert sweep("--out", "s") == 2
    one_line_error(capsys, "Permission denied")
    assert [p for p in (proj / "s" / "points").iterdir()] == []


# ------------------------------------------------------------------- locks, leftovers

def test_two_runs_into_one_folder_through_a_symlink_are_refused(proj, capsys):
    (proj / "real").mkdir()
    (proj / "link").symlink_to(proj / "real")
    with storage.out_lock(proj / "real"):
        assert run("--out", "link") == 2
        one_line_error(capsys, "another simserve run")
        assert sweep("--out", "link") == 2
        one_line_error(capsys, "another simserve run")
    assert run("--out", "link") == 0 and (proj / "real" / MARKER).is_file()


def test_leftovers_of_a_killed_run_are_cleaned_on_the_next_run(proj):
    assert run("--out", "r") == 0
    dead = proj / f".r{storage.TMP}dead1234"        # a killed --stream run's staging folder
    dead.mkdir()
    (dead / "requests.csv").write_bytes(b"x" * 100_000)
    (proj / f".r{storage.OLD}dead5678").mkdir()
    (proj / "r" / f".summary.json{storage.TMP}4242").write_text("[")
    other = proj / f".other{storage.TMP}keep"        # another folder's: not ours to clean
    other.mkdir()
    users = [proj / ".r.tmp-mine", proj / "r" / ".notes.tmp-1"]   # the user's, by their names
    users[0].mkdir()
    users[1].write_text("my notes")
    assert run("--out", "r", "--stream") == 0
    assert not dead.exists() and not (proj / f".r{storage.OLD}dead5678").exists()
    assert not (proj / "r" / f".summary.json{storage.TMP}4242").exists() and other.exists()
    assert users[0].is_dir() and users[1].read_text() == "my notes"


def test_leftovers_are_kept_while_a_live_run_holds_the_lock(proj, capsys):
    assert run("--out", "r") == 0
    live = proj / f".r{storage.TMP}live0000"
    live.mkdir()
    with storage.out_lock(proj / "r"):
        assert run("--out", "r") == 2
        one_line_error(capsys, "another simserve run")
    assert live.exists()


# ------------------------------------------------------------------------ parse cache

@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SIMSERVE_PARSE_CACHE", raising=False)
    monkeypatch.delenv("SIMSERVE_PARSE_CACHE_MAX_MB", raising=False)
    _CLOSURE.cache_clear()
    yield parsed_cache.cache_folder()
    _CLOSURE.cache_clear()


def _copy_package(tmp_path, monkeypatch) -> Path:
    import shutil

    from simserve import paths
    copy = tmp_path / "copy" / "simserve"
    shutil.copytree(paths.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    monkeypatch.setattr(paths, "PACKAGE_DIR", copy)
    return copy


def test_editing_a_helper_the_reader_imports_changes_its_key(cache, tmp_path, monkeypatch):
    copy = _copy_package(tmp_path, monkeypatch)
    before = parsed_cache.source_closure("simserve.workload.readers")
    spec = copy / "workload" / "spec.py"     # readers imports Workload from it
    spec.write_text(spec.read_text() + "\n# edited helper\n")
    parsed_cache.source_closure.cache_clear()
    assert parsed_cache.source_closure("simserve.workload.readers") != before


def test_editing_an_unrelated_module_keeps_the_key(cache, tmp_path, monkeypatch):
    copy = _copy_package(tmp_path, monkeypatch)
    before = parsed_cache.source_closure("simserve.workload.readers")
    vllm = copy / "policies" / "vllm.py"
    vllm.write_text(vllm.read_text() + "\n# edited policy\n")
    parsed_cache.source_closure.cache_clear()
    assert parsed_cache.source_closure("simserve.workload.readers") == before


def test_the_closure_digest_is_reused_only_while_its_files_stat_the_same(cache, tmp_path,
                                                                         monkeypatch):
    copy = _copy_package(tmp_path, monkeypatch)
    before = parsed_cache.source_closure("simserve.workload.readers")
    parsed_cache.source_closure.cache_clear()
    walk = parsed_cache._closure
    monkeypatch.setattr(parsed_cache, "_closure", lambda name: pytest.fail("walked again"))
    assert parsed_cache.source_closure("simserve.workload.readers") == before  # the memo
    monkeypatch.setattr(parsed_cache, "_closure", walk)
    spec = copy / "workload" / "spec.py"     # same size, one byte changed: the stat differs
    text = spec.read_text()
    i = text.index("Workload")
    spec.write_text(text[:i] + "w" + text[i + 1:])
    parsed_cache.source_closure.cache_clear()
    assert parsed_cache.source_closure("simserve.workload.readers") != before


def test_a_changed_closure_misses_the_cache(cache, proj, monkeypatch):
    from simserve.workload.build import _decode, _encode
    from simserve.workload.readers import read_trace
    parsed_cache.cached_parse(proj / "tr.csv", "trace", read_trace, _encode, _decode)
    assert len(parsed_cache.entries()) == 1
    parsed_cache.cached_parse(proj / "tr.csv", "trace", read_trace, _encode, _decode)
    assert len(parsed_cache.entries()) == 1     # a hit
    real = parsed_cache.source_closure
    monkeypatch.setattr(parsed_cache, "source_closure",
                        lambda m: real(m) + ("x" if m == "simserve.workload.readers" else ""))
    parsed_cache.cached_parse(proj / "tr.csv", "trace", read_trace, _encode, _decode)
    assert len(parsed_cache.entries()) == 2     # the edited reader missed


def _entry(folder: Path, name: str, size: int, when: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"t-{name}{parsed_cache.ENTRY_SUFFIX}"
    p.write_bytes(b"\0" * size)
    os.utime(p, (when, when))
    return p


def test_prune_removes_the_least_recently_used_first(cache):
    old, mid, new = (_entry(cache, n, 1000, t) for n, t in (("a", 1e9), ("b", 2e9), ("c", 3e9)))
    gone = parsed_cache.prune(cap=2500)
    assert gone == [old] and mid.exists() and new.exists()


def test_a_hit_refreshes_the_entrys_last_use(cache, tmp_path):
    f = tmp_path / "n.txt"
    f.write_text("7")

    def parse(p):
        return int(p.read_text())
    assert parsed_cache.cached_parse(f, "t", parse) == 7
    (entry,) = [p for p, _, _ in parsed_cache.entries()]
    os.utime(entry, (1e9, 1e9))
    assert parsed_cache.cached_parse(f, "t", parse) == 7
    assert len(parsed_cache.entries()) == 1
    assert entry.stat().st_mtime > 1e9 + 1


def test_the_cap_comes_from_the_environment_and_is_kept(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("SIMSERVE_PARSE_CACHE_MAX_MB", "0.004")   # 4,194 bytes
    assert parsed_cache.max_bytes() == int(0.004 * 1024 * 1024)
    for i in range(6):
        _entry(cache, f"old{i}", 1000, 1e9 + i)
    f = tmp_path / "n.txt"
    f.write_text("5")
    parsed_cache.cached_parse(f, "t", lambda p: int(p.read_text()))
    assert sum(s for _, s, _ in parsed_cache.entries()) <= parsed_cache.max_bytes()
    assert not (cache / f"t-old0{parsed_cache.ENTRY_SUFFIX}").exists()


def test_cache_clear_and_info(cache, capsys):
    _entry(cache, "a", 1000, 1e9)
    _entry(cache, "b", 2000, 2e9)
    keep = cache / "README.mine"
    keep.write_text("not an entry")
    assert main(["cache", "info"]) == 0
    assert "2 entries" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 2 file(s)" in capsys.readouterr().out
    assert parsed_cache.entries() == [] and keep.exists()


def test_an_unwritable_trace_events_file_is_one_line(proj, capsys, monkeypatch):
    real_open = open

    def full(path, *a, **kw):
        if str(path).endswith("ev.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, *a, **kw)
    monkeypatch.setattr("builtins.open", full)
    assert main(["run", "ex.yaml", "-q", "--no-save", "--trace-events", "ev.json"]) == 2
    monkeypatch.undo()
    one_line_error(capsys, "No space left on device", "ev.json")
