"""Running a sweep: the points not done yet, each stored in `OUT/points/<hash>/` (written to a
temporary sibling and renamed, so a folder that exists is complete), then `OUT/summary.json`
(a list of run records, as `vllm bench` tools read) and `OUT/summary.csv`, also atomically.
A point's own record is `record.json`, so the top summary is the only `summary.json` a
recursive loader finds (folders written before keep `summary.json` until a rerun renames it).

A rerun skips finished points (resume after a crash or Ctrl-C) and removes half-written
temporary folders; a second sweep into a folder that one is writing is refused (`out_lock`).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from simserve.errors import ConfigError, SimserveError
from simserve.runner.config import TOP_KEYS, ExperimentConfig
from simserve.runner.point import points, run_point
from simserve.runner.storage import (atomic_folder, out_lock, records_frame, records_json,
                                     write_config, write_records)
from simserve.runner.sweep import Sweep, SweepPoint, check_points
from simserve.hardware.setup import Hardware

POINT_FILES = ("record.json", "requests.csv", "config.yaml")
LEGACY_RECORD = "summary.json"  # a point's record before record.json


def simulate_one(task: tuple[ExperimentConfig, Hardware, str]) -> tuple[dict, str]:
    """Run a point's simulation (in a worker): its run summary and requests.csv text. The
    result depends on the config alone, whichever process or machine runs it. The hardware
    comes resolved from the parent (pickled: ~100 KB, under 1 ms) because parsing the
    profiles' YAML would cost a worker ~0.5 s per point."""
    cfg, hardware, where = task
    try:
        res = run_point(cfg, points(cfg)[0], hardware)
    except SimserveError as exc:
        raise type(exc)(f"{exc} (in the sweep point {where})") from None
    return res.summary, res.requests.to_csv(index=False, float_format="%.9g")


def is_done(folder: Path) -> bool:
    return all((folder / f).is_file() or (f == POINT_FILES[0] and (folder / LEGACY_RECORD).is_file())
               for f in POINT_FILES)


def clean_temp(points_dir: Path) -> list[Path]:
    """Remove half-written point folders left by an interrupted run."""
    gone = [p for p in points_dir.glob(".*.tmp-*") if p.is_dir()]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def write_point(points_dir: Path, sp: SweepPoint, summary: dict, requests_csv: str) -> Path:
    """points/<hash>/ with record.json (a list of one record), requests.csv, config.yaml;
    written to a temporary sibling and renamed, so a folder that exists is complete."""
    dest = points_dir / sp.key
    with atomic_folder(dest) as tmp:
        write_records(tmp / POINT_FILES[0], [{**sp.ident(), **summary}])
        (tmp / "requests.csv").write_text(requests_csv)
        write_config(tmp / "config.yaml", sp.cfg.resolved(),
                     f"resolved config of one sweep point; sha256[:16] = {sp.key}")
    return dest


def read_record(points_dir: Path, sp: SweepPoint) -> dict:
    """A stored point's record, with identifying fields from the current expansion (a point
    reused by an edited sweep may have had another variant name)."""
    folder = points_dir / sp.key
    if not (folder / POINT_FILES[0]).is_file():  # written before record.json: rename it
        os.replace(folder / LEGACY_RECORD, folder / POINT_FILES[0])
    with open(folder / POINT_FILES[0]) as f:
        stored = json.load(f)[0]
    # the run's own description (model, gpu, ...) is kept; swept keys come from the expansion
    metrics = {k: v for k, v in stored.items()
               if k not in ("point", "variant") and "." not in k
               and (k not in TOP_KEYS or k == "model")}
    return {**sp.ident(), **metrics}


def check_sweep_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not (out / "points").is_dir():
        raise SimserveError(f"--out {out}: folder exists with other content (not a sweep's "
                            "results); refusing to write into it")


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
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
class SweepOutcome:
    records: list[dict]   # one per point, in expansion order
    num_run: int          # simulations run now
    num_skipped: int      # simulations found done
    out: Path


def run_sweep(sweep: Sweep, out: str | Path, executor: str = "local", workers: int | None = None,
              scheduler: str | None = None, progress: bool = True, client=None) -> SweepOutcome:
    """Run the points whose folders are missing, then write OUT/summary.json and .csv.
    `client` (a `distributed.Client`) is used by the dask executor when given."""
    from tqdm.auto import tqdm

    from simserve.runner.executors import check_executor, make_executor

    out = Path(out)
    check_executor(executor, workers, scheduler)
    check_sweep_out(out)
    with out_lock(out):  # a second sweep into the same folder at the same time is refused
        return _run_sweep(sweep, out, executor, workers, scheduler, progress, client)


def _run_sweep(sweep: Sweep, out: Path, executor: str, workers: int | None,
               scheduler: str | None, progress: bool, client) -> SweepOutcome:
    from tqdm import tqdm

    from simserve.runner.executors import make_executor

    hardware = check_points(sweep)
    pdir = out / "points"
    unique = sweep.unique()
    todo = [sp for sp in unique if not is_done(pdir / sp.key)]
    skipped = len(unique) - len(todo)
    # the executor first: a scheduler that cannot be reached leaves no folder behind
    ex = make_executor(executor, workers=workers, scheduler=scheduler, client=client) \
        if todo else nullcontext()
    with ex:
        pdir.mkdir(parents=True, exist_ok=True)
        clean_temp(pdir)
        with tqdm(total=len(unique), initial=skipped, desc=sweep.name, unit="point",
                  file=sys.stderr, leave=False, disable=not progress) as bar:
            if todo:
                tasks = [(sp.cfg, hardware[sp.cfg.hardware], sp.describe()) for sp in todo]
                for i, (summary, csv) in ex.map_unordered(simulate_one, tasks):
                    write_point(pdir, todo[i], summary, csv)
                    bar.update()
    records = [read_record(pdir, sp) for sp in sweep.points]
    write_summaries(out, records)
    return SweepOutcome(records, len(todo), skipped, out)


def point_status(sweep: Sweep, out: str | Path) -> list[bool]:
    pdir = Path(out) / "points"
    return [is_done(pdir / sp.key) for sp in sweep.points]
