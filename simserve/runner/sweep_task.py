"""What a sweep worker is sent and runs. A worker may be another process on this machine, or a
Dask or Ray worker on another machine, in another folder, without the submitter's files: it
gets everything a point reads from disk, resolved by the submitting process (`SweepInputs`,
sent once per worker), and each point's config (`SweepTask`). Only simserve itself (the same
version) must be installed there.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from simserve.errors import SimserveError
from simserve.hardware.setup import Hardware, HardwareConfig
from simserve.runner.config import ExperimentConfig
from simserve.runner.point import make_workload, points, run_date, run_point
from simserve.workload.build import is_trace_file, load_named_trace
from simserve.workload.spec import Workload


@dataclass(frozen=True)
class SweepInputs:
    """The files behind a sweep's points, read here: hardware resolved from its profiles
    (~100 KB pickled; parsing the YAML would cost a worker ~0.5 s a point), trace files parsed
    (a worker may not see them), and SOURCE_DATE_EPOCH (records' `date`)."""
    hardware: dict[HardwareConfig, Hardware]
    traces: dict[str, Workload]
    date_epoch: str | None


@dataclass(frozen=True)
class SweepTask:
    cfg: ExperimentConfig  # one point: one policy, rate and seed
    where: str             # the point as the user knows it, for errors


def sweep_inputs(cfgs: list[ExperimentConfig], hardware: dict) -> SweepInputs:
    names = {c.workload.trace for c in cfgs if is_trace_file(c.workload.trace)}
    return SweepInputs({c.hardware: hardware[c.hardware] for c in cfgs},
                       {t: load_named_trace(t) for t in sorted(names)},
                       os.environ.get("SOURCE_DATE_EPOCH"))


def simulate_one(task: SweepTask, inputs: SweepInputs) -> tuple[dict, str]:
    """Run a point's simulation (in a worker): its run summary and requests.csv text. The
    result depends on the config and the inputs alone, whichever process or machine runs it."""
    cfg = task.cfg
    pt = points(cfg)[0]
    try:
        wl = make_workload(cfg, pt.rate, pt.seed, loaded=inputs.traces.get(cfg.workload.trace))
        res = run_point(cfg, pt, inputs.hardware[cfg.hardware], workload=wl)
    except SimserveError as exc:
        raise type(exc)(f"{exc} (in the sweep point {task.where})") from None
    if inputs.date_epoch is not None:
        res.summary["date"] = run_date(inputs.date_epoch)
    return res.summary, res.requests.to_csv(index=False, float_format="%.9g")
