"""Results folders written before simserve's `.simserve.json` marker: recognised by their
layout, refused with a line naming `--adopt`, taken over by `--adopt` (a sweep's
`--reuse-stale` too) without touching anything else, and never adopted when they hold a file
simserve does not write there."""
from __future__ import annotations

import json
import os

from simserve.runner.provenance import MARKER
from tests.test_results_trust import counting, one_line_error, proj, run, sweep, tree

__all__ = ["proj"]  # the fixture, shared


def _as_an_older_simserve_left_it(folder):
    """No marker, no provenance, points' records still named summary.json."""
    (folder / MARKER).unlink()
    for p in folder.glob("points/*/provenance.json"):
        p.unlink()
    for p in folder.glob("points/*/record.json"):
        os.replace(p, p.with_name("summary.json"))


def test_an_old_sweep_folder_is_refused_naming_the_flag_that_adopts_it(proj, capsys):
    assert sweep("--out", "s") == 0
    _as_an_older_simserve_left_it(proj / "s")
    before = tree(proj / "s")
    capsys.readouterr()
    assert sweep("--out", "s") == 2
    one_line_error(capsys, "older", "--adopt", "--reuse-stale")
    assert tree(proj / "s") == before


def test_adopt_takes_an_old_sweep_over_and_reruns_its_points(proj, monkeypatch):
    assert sweep("--out", "s") == 0
    _as_an_older_simserve_left_it(proj / "s")
    calls = counting(monkeypatch)
    assert sweep("--out", "s", "--adopt") == 0
    assert len(calls) == 2   # no provenance: stale
    m = json.loads((proj / "s" / MARKER).read_text())
    assert (m["kind"], m["complete"], m["points_done"]) == ("sweep", True, 2)
    assert all((p / "provenance.json").is_file() for p in (proj / "s" / "points").iterdir())
    assert sweep("--out", "s") == 0 and len(calls) == 2   # now simserve's: a plain resume


def test_reuse_stale_adopts_an_old_sweep_and_keeps_its_points(proj, monkeypatch):
    assert sweep("--out", "s") == 0
    want = json.loads((proj / "s" / "summary.json").read_text())
    _as_an_older_simserve_left_it(proj / "s")
    calls = counting(monkeypatch)
    assert sweep("--out", "s", "--reuse-stale") == 0
    assert calls == []
    recs = json.loads((proj / "s" / "summary.json").read_text())
    assert all("no provenance" in r.pop("stale") for r in recs) and recs == want


def test_an_old_sweep_folder_with_a_users_file_is_never_adopted(proj, capsys):
    assert sweep("--out", "s") == 0
    _as_an_older_simserve_left_it(proj / "s")
    (proj / "s" / "analysis.ipynb").write_text('{"cells": []}')
    (proj / "s" / "points" / "notes.txt").write_text("mine")
    before = tree(proj / "s")
    for flag in ("--adopt", "--reuse-stale"):
        capsys.readouterr()
        assert sweep("--out", "s", flag) == 2
        one_line_error(capsys, "analysis.ipynb", "refusing to adopt")
    (proj / "s" / "analysis.ipynb").unlink()
    capsys.readouterr()
    assert sweep("--out", "s", "--adopt") == 2
    one_line_error(capsys, "notes.txt")
    (proj / "s" / "analysis.ipynb").write_text('{"cells": []}')
    assert tree(proj / "s") == before


def test_an_old_run_folder_is_adopted_by_run_only_with_the_flag(proj, capsys):
    assert run("--out", "r") == 0
    (proj / "r" / MARKER).unlink()
    before = tree(proj / "r")
    capsys.readouterr()
    assert run("--out", "r") == 2
    one_line_error(capsys, "older", "--adopt")
    assert sweep("--out", "r", "--adopt") == 2   # a run's folder is not a sweep's
    assert tree(proj / "r") == before
    assert run("--out", "r", "--adopt") == 0
    m = json.loads((proj / "r" / MARKER).read_text())
    assert m["kind"] == "run" and m["complete"] is True
    assert run("--out", "r") == 0


def test_a_users_folder_that_only_looks_like_results_is_not_adopted(proj, capsys):
    (proj / "u").mkdir()
    (proj / "u" / "summary.json").write_text("[]")
    (proj / "u" / "config.yaml").write_text("model: mine\n")   # not simserve's resolved config
    before = tree(proj / "u")
    assert run("--out", "u", "--adopt") == 2
    one_line_error(capsys, "refusing to adopt")
    assert tree(proj / "u") == before
