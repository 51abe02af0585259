"""Running a sweep: the points not done yet, each stored in `OUT/points/<hash>/` (written to a
temporary sibling and renamed, so a folder that exists is complete) with the provenance it was
made from; as points finish `OUT/summary.json` (a list of run records, as `vllm bench` tools
read), `OUT/summary.csv` and the marker `OUT/.simserve.json`, each atomically (`sweep_store`:
batched, and always at the end or on an interruption). A point's own record is `record.json`, so the top summary is the only
`summary.json` a recursive loader finds (folders written before keep `summary.json` until a
rerun renames it).

A rerun skips finished points whose provenance matches (resume after a crash or Ctrl-C),
reruns the stale ones (or keeps them with `reuse_stale`, saying so) and removes half-written
temporary folders; a second sweep into a folder that one is writing is refused (`out_lock`),
and so is a folder simserve did not make (`storage.claim_out`).
"""
from __future__ import annotations

import shutil
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from simserve.errors import ConfigError
from simserve.runner.provenance import POINT_PROVENANCE, TMP, write_json_atomic
from simserve.runner.storage import (atomic_folder, claim_out, clean_stale_temp, os_error,
                                     out_lock, write_config, write_records)
from simserve.runner.sweep import Sweep, SweepPoint, check_points
from simserve.runner.sweep_store import (LEGACY_RECORD, POINT_FILES, Plan,  # noqa: F401
                                         SummaryStore, is_done, plan_points, read_record,
                                         write_summaries)
from simserve.runner.sweep_task import SweepTask, simulate_one, sweep_inputs

def clean_temp(points_dir: Path) -> list[Path]:
    """Remove half-written point folders left by an interrupted run."""
    gone = [p for p in points_dir.glob(f".*{TMP}*") if p.is_dir()]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def write_point(points_dir: Path, sp: SweepPoint, summary: dict, requests_csv: str,
                prov: dict | None = None) -> Path:
    """points/<hash>/ with record.json (a list of one record), requests.csv, config.yaml and
    provenance.json (what it was made from); written to a temporary sibling and renamed, so a
    folder that exists is complete."""
    dest = points_dir / sp.key
    with atomic_folder(dest) as tmp:
        if prov is not None:
            write_json_atomic(tmp / POINT_PROVENANCE, prov)
        write_records(tmp / POINT_FILES[0], [{**sp.ident(), **summary}])
        (tmp / "requests.csv").write_text(requests_csv)
        write_config(tmp / "config.yaml", sp.cfg.resolved(),
                     f"resolved config of one sweep point; sha256[:16] = {sp.key}")
    return dest


def check_sweep_out(out: Path, overwrite: bool = False, adopt: bool = False) -> dict | None:
    """Fail before running when `sweep` may not write at `out` (`storage.claim_out`;
    `adopt`: take over an older simserve's sweep folder, `adopt.older_results`)."""
    return claim_out(out, "sweep", overwrite, adopt)


@dataclass
class SweepOutcome:
    records: list[dict]   # one per point, in expansion order
    num_run: int          # simulations run now
    num_skipped: int      # simulations found done (fresh, or stale reused with --reuse-stale)
    out: Path
    stale: dict = field(default_factory=dict)  # reason -> simulations found stale


def run_sweep(sweep: Sweep, out: str | Path, executor: str = "local", workers: int | None = None,
              scheduler: str | None = None, progress: bool = True, client=None,
              address: str | None = None, overwrite: bool = False,
              reuse_stale: bool = False, adopt: bool = False) -> SweepOutcome:
    """Run the points not stored yet, or stored from other inputs (`provenance.staleness`:
    another trace file content, simserve version or code; with `reuse_stale` these are kept,
    with a warning), then write OUT/summary.json and .csv. `overwrite` takes over a folder
    simserve did not make and reruns every point. `client` (a `distributed.Client`) is used
    by the dask executor when given; `address` is a Ray cluster's (the ray executor; a process
    that called `ray.init` needs none). `adopt` (or `reuse_stale`) takes over a sweep folder
    an older simserve wrote without a marker (`adopt.older_results`): its points have no
    provenance, so they rerun (`reuse_stale`: are kept, marked stale)."""
    from simserve.runner.executors import check_executor

    out = Path(out)
    if overwrite and reuse_stale:
        raise ConfigError("--overwrite reruns every point and --reuse-stale keeps stale ones: "
                          "give one of them")
    ex_opts = dict(name=executor, workers=workers, scheduler=scheduler, client=client,
                   address=address)
    check_executor(executor, workers, scheduler, address)
    with out_lock(out):  # a second sweep into the same folder at the same time is refused
        old = check_sweep_out(out, overwrite, adopt or reuse_stale)
        try:
            clean_stale_temp(out)
            return _run_sweep(sweep, out, ex_opts, progress, old, overwrite, reuse_stale)
        except OSError as exc:
            raise os_error(out, exc) from None


def _run_sweep(sweep: Sweep, out: Path, ex_opts: dict, progress: bool, old: dict | None,
               overwrite: bool, reuse_stale: bool) -> SweepOutcome:
    """`ex_opts`: `make_executor`'s arguments; `old`: the folder's marker."""
    from tqdm import tqdm

    from simserve.runner.executors import make_executor

    hardware = check_points(sweep)
    pdir = out / "points"
    unique = sweep.unique()
    plan = plan_points(unique, pdir, overwrite, reuse_stale)
    _tell_stale(plan, reuse_stale)
    todo = plan.todo
    # the executor first: a scheduler that cannot be reached leaves no folder behind
    ex = make_executor(**ex_opts) if todo else nullcontext()
    with ex:
        store = SummaryStore(sweep, out, plan, old)
        store.write()  # the marker first: a folder with points/ is always marked
        pdir.mkdir(parents=True, exist_ok=True)
        clean_temp(pdir)
        with tqdm(total=len(unique), initial=len(unique) - len(todo), desc=sweep.name,
                  unit="point", file=sys.stderr, leave=False, disable=not progress) as bar:
            if todo:
                # what the points read from disk, read here: a worker may be on another machine
                inputs = sweep_inputs([sp.cfg for sp in todo], hardware)
                tasks = [SweepTask(sp.cfg, sp.describe()) for sp in todo]
                try:
                    for i, (summary, csv) in ex.map_unordered(simulate_one, tasks, inputs):
                        write_point(pdir, todo[i], summary, csv, plan.current[todo[i].key])
                        store.done(todo[i])
                        bar.update()
                except BaseException:
                    _flush_quietly(store)   # the summary of the points stored so far
                    raise
    records = store.write(final=True)
    return SweepOutcome(records, len(todo), len(unique) - len(todo), out, plan.stale_counts())


def _flush_quietly(store: SummaryStore) -> None:
    """Bring the summary up to the points stored, while another error propagates (a failure
    here leaves the last consistent summary, which the resume replaces)."""
    try:
        store.flush()
    except Exception:
        pass


def _tell_stale(plan: Plan, reuse_stale: bool) -> None:
    counts = plan.stale_counts()
    if not counts:
        return
    n = sum(counts.values())
    why = "; ".join(f"{c} {reason}" for reason, c in counts.items())
    if reuse_stale:
        print(f"simserve: warning: reusing {n} stale point(s) (--reuse-stale): {why}; their "
              "records say so in `stale`", file=sys.stderr)
    else:
        print(f"simserve: rerunning {n} stored point(s) made from other inputs: {why} "
              "(--reuse-stale keeps them)", file=sys.stderr)


def point_status(sweep: Sweep, out: str | Path) -> list[str]:
    """Per point: "done", "stale" (stored from other inputs: it would rerun) or "todo"."""
    pdir = Path(out) / "points"
    plan = plan_points(sweep.unique(), pdir, overwrite=False, reuse_stale=False)
    return ["stale" if sp.key in plan.stale else "todo" if sp.key in plan.todo_keys else "done"
            for sp in sweep.points]
