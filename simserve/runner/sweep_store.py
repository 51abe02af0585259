"""A sweep's results folder as it fills: which stored points can be reused (`plan_points`),
and `summary.json` / `summary.csv` / the marker rewritten as points finish (`SummaryStore`),
each atomically, so a sweep killed at any moment leaves a consistent folder: a summary of
points that are all present, and a marker saying `complete: false` with how many the summary
holds; the resume reads `points/`, so the rest are not rerun. A rewrite is O(points), so it is
batched: after a point, the summary is rewritten once `WRITE_INTERVAL_S` have passed since the
last rewrite and at least `WRITE_COST_FACTOR` times as long as that rewrite took (its cost then
stays within ~1/20 of the sweep's time at any size), and always when the sweep ends or is
interrupted (Ctrl-C, an error); only a process killed outright leaves a summary that lags the
points, by at most that interval.

A stored point is reused only when its `provenance.json` matches what this process would
compute (`provenance.staleness`: config, trace file content, simserve version, code); a point
stored by an older simserve has none and counts as stale.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from simserve.runner import provenance as prov
from simserve.runner.config import TOP_KEYS
from simserve.runner.point_inputs import modules_hash, profile_names
from simserve.runner.storage import plain_name, records_frame, records_json, remove_path

POINT_FILES = ("record.json", "requests.csv", "config.yaml")
WRITE_INTERVAL_S = 1.0   # the summary lags a finished point by at most this (or below)
WRITE_COST_FACTOR = 20   # ... or by this many times the last rewrite's own time
_clock = time.monotonic
LEGACY_RECORD = "summary.json"  # a point's record before record.json
SWEEP_FILES = ("summary.json", "summary.csv", "points")


def is_done(folder: Path) -> bool:
    return all((folder / f).is_file() or (f == POINT_FILES[0] and (folder / LEGACY_RECORD).is_file())
               for f in POINT_FILES)


def read_record(points_dir: Path, sp) -> dict:
    """A stored point's record, with identifying fields from the current expansion (a point
    reused by an edited sweep may have had another variant name)."""
    return {**sp.ident(), **stored_metrics(points_dir, sp.key)}


def stored_metrics(points_dir: Path, key: str) -> dict:
    """A stored point's record without the fields that identify it in a sweep."""
    folder = points_dir / key
    if not (folder / POINT_FILES[0]).is_file():  # written before record.json: rename it
        os.replace(folder / LEGACY_RECORD, folder / POINT_FILES[0])
    with open(folder / POINT_FILES[0]) as f:
        stored = json.load(f)[0]
    # the run's own description (model, gpu, ...) is kept; swept keys come from the expansion
    return {k: v for k, v in stored.items()
            if k not in ("point", "variant", "stale") and "." not in k
            and (k not in TOP_KEYS or k == "model")}


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}{prov.TMP}{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_summaries(out: Path, records: list[dict]) -> None:
    _atomic_text(out / "summary.json", records_json(records))
    _atomic_text(out / "summary.csv", records_frame(records).to_csv(index=False))


@dataclass
class Plan:
    todo: list                   # SweepPoints to simulate now
    current: dict                # point key -> the provenance a result made now would have
    stale: dict = field(default_factory=dict)  # point key -> why its stored result is stale
    reuse_stale: bool = False    # stale points are kept (with a warning), not rerun

    @property
    def todo_keys(self) -> set:
        return {sp.key for sp in self.todo}

    def stale_counts(self) -> dict:
        return dict(Counter(self.stale.values()).most_common())


def plan_points(unique: list, pdir: Path, overwrite: bool, reuse_stale: bool) -> Plan:
    """Which of the distinct points to run: those not stored, those stored from other inputs
    (unless `reuse_stale`), and with `overwrite` every one."""
    version = prov.simserve_version()
    modules_hash.cache_clear()  # the code as it is now (a notebook may have edited it since)
    plan = Plan([], {}, reuse_stale=reuse_stale)
    code: dict = {}  # points of one hardware and policy share their code hash
    for sp in unique:
        same = (tuple(p.name for p in sp.cfg.policies), tuple(profile_names(sp.cfg)))
        if same not in code:
            code[same] = prov.point_code_hash(sp.cfg)
        cur = {"simserve_version": version, "code_hash": code[same], "config_hash": sp.key,
               "traces": prov.trace_hashes(sp.cfg)}
        plan.current[sp.key] = cur
        folder = pdir / sp.key
        if overwrite or not is_done(folder):
            plan.todo.append(sp)
            continue
        why = prov.staleness(prov.read_json(folder / prov.POINT_PROVENANCE), cur)
        if why is not None:
            plan.stale[sp.key] = why
            if not reuse_stale:
                plan.todo.append(sp)
    return plan


class SummaryStore:
    """The records of the points present, in expansion order, rewritten as points finish
    (batched: see the module's docstring)."""

    def __init__(self, sweep, out: Path, plan: Plan, old_marker: dict | None):
        self.sweep, self.out, self.plan, self.old = sweep, out, plan, old_marker
        self.pdir = out / "points"
        self._stored: dict[str, dict] = {}  # point key -> its record.json, read once
        self._written_at, self._write_s, self._pending = _clock(), 0.0, False
        todo = plan.todo_keys
        self.present = {sp.key for sp in sweep.unique() if sp.key not in todo}
        first = sweep.points[0].key if sweep.points else ""
        codes = sorted({c["code_hash"] for c in plan.current.values()})
        self.prov = {**{k: v for k, v in plan.current.get(first, {}).items()
                        if k == "simserve_version"},
                     # the points' code hashes: the one they share, else a hash of them all
                     "code_hash": codes[0] if len(codes) == 1 else
                     hashlib.sha256("\n".join(codes).encode()).hexdigest()[:16],
                     "config_hash": _grid_hash(plan.current),
                     "traces": {n: h for c in plan.current.values()
                                for n, h in c["traces"].items()}}

    def done(self, sp) -> None:
        """Point `sp` is stored: rewrite the summary if one is due."""
        self.present.add(sp.key)
        self._pending = True
        if _clock() - self._written_at >= max(WRITE_INTERVAL_S,
                                              WRITE_COST_FACTOR * self._write_s):
            self.write()

    def flush(self) -> None:
        """Rewrite the summary if points finished since the last rewrite."""
        if self._pending:
            self.write()

    def records(self) -> list[dict]:
        out = []
        for sp in self.sweep.points:
            if sp.key in self.present:
                if sp.key not in self._stored:
                    self._stored[sp.key] = stored_metrics(self.pdir, sp.key)
                rec = {**sp.ident(), **self._stored[sp.key]}
                if sp.key in self.plan.stale and sp.key not in self.plan.todo_keys:
                    rec["stale"] = self.plan.stale[sp.key]
                out.append(rec)
        return out

    def write(self, final: bool = False) -> list[dict]:
        """summary.json, summary.csv, then the marker (`complete` once every point is in)."""
        start = _clock()
        if self.old is not None and self.old.get("kind") != "sweep":  # taken over: --overwrite
            for name in self.old.get("files", []):
                if plain_name(name) and name not in SWEEP_FILES:
                    remove_path(self.out / name)
            self.old = None
        self.out.mkdir(parents=True, exist_ok=True)
        recs = self.records()
        write_summaries(self.out, recs)
        n_unique = len(self.plan.current)
        prov.write_json_atomic(self.out / prov.MARKER, prov.marker(
            "sweep", self.prov, list(SWEEP_FILES), complete=len(self.present) == n_unique,
            points_done=len(self.present), points_total=n_unique,
            stale_reused=sum(1 for k in self.plan.stale if k not in self.plan.todo_keys)))
        self._written_at = _clock()
        self._write_s, self._pending = self._written_at - start, False
        return recs


def _grid_hash(current: dict) -> str:
    """sha256[:16] over the distinct points' config hashes (the grid, in any order)."""
    return hashlib.sha256("\n".join(sorted(current)).encode()).hexdigest()[:16]
