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


from simserve.errors import ConfigError, SimserveError
from simserve.runner.config import TOP_KEYS
from simserve.runner.storage import (atomic_folder, out_lock, records_frame, records_json,
                                     write_config, write_records)
from simserve.runner.sweep import Sweep, SweepPoint, check_points
from simserve.runner.sweep_task import SweepTask, simulate_one, sweep_inputs

POINT_FILES = ("record.json", "requests.csv", "config.yaml")
LEGACY_RECORD = "summary.json"  # a point's record before record.json


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
              scheduler: str | None = None, progress: bool = True, client=None,
              address: str | None = None) -> SweepOutcome:
    """Run the points whose folders are missing, then write OUT/summary.json and .csv.
    `client` (a `distributed.Client`) is used by the dask executor when given; `address` is
    a Ray cluster's (the ray executor; a process that called `ray.init` needs none)."""
    from simserve.runner.executors import check_executor

    out = Path(out)
    ex_opts = dict(name=executor, workers=workers, scheduler=scheduler, client=client,
                   address=address)
    check_executor(executor, workers, scheduler, address)
    check_sweep_out(out)
    with out_lock(out):  # a second sweep into the same folder at the same time is refused
        return _run_sweep(sweep, out, ex_opts, progress)


def _run_sweep(sweep: Sweep, out: Path, ex_opts: dict, progress: bool) -> SweepOutcome:
    """`ex_opts`: `make_executor`'s arguments."""
    from tqdm import tqdm

    from simserve.runner.executors import make_executor

    hardware = check_points(sweep)
    pdir = out / "points"
    unique = sweep.unique()
    todo = [sp for sp in unique if not is_done(pdir / sp.key)]
    skipped = len(unique) - len(todo)
    # the executor first: a scheduler that cannot be reached leaves no folder behind
    ex = make_executor(**ex_opts) if todo else nullcontext()
    with ex:
        pdir.mkdir(parents=True, exist_ok=True)
        clean_temp(pdir)
        with tqdm(total=len(unique), initial=skipped, desc=sweep.name, unit="point",
                  file=sys.stderr, leave=False, disable=not progress) as bar:
            if todo:
                # what the points read from disk, read here: a worker may be on another machine
                inputs = sweep_inputs([sp.cfg for sp in todo], hardware)
                tasks = [SweepTask(sp.cfg, sp.describe()) for sp in todo]
                for i, (summary, csv) in ex.map_unordered(simulate_one, tasks, inputs):
                    write_point(pdir, todo[i], summary, csv)
                    bar.update()
    records = [read_record(pdir, sp) for sp in sweep.points]
    write_summaries(out, records)
    return SweepOutcome(records, len(todo), skipped, out)


def point_status(sweep: Sweep, out: str | Path) -> list[bool]:
    pdir = Path(out) / "points"
    return [is_done(pdir / sp.key) for sp in sweep.points]
