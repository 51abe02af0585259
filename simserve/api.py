"""The Python API a notebook uses: `simulate` one point, `run_experiment` a whole YAML."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from simserve.runner.config import ExperimentConfig, load_experiment, parse_experiment
from simserve.runner.point import PointResult, Point, run_experiment_config, run_point
from simserve.workload.spec import Workload


def simulate(policy: str = "vllm", *, model: str = "llama-3.1-8b", gpu: str = "h100-sxm",
             num_gpus: int = 1, trace: str = "synthetic-conversation",
             num_requests: int | None = 2000, rate: float = 4.0, arrival: str = "poisson",
             seed: int = 0, slo: dict | None = None, workload: Workload | None = None,
             hardware: dict | None = None, max_concurrency: int | None = None,
             workload_options: dict | None = None, **policy_params) -> PointResult:
    """Simulate one point and return its per-request DataFrame (`.requests`), its metrics
    (`.summary`, a dict; `.summary_frame()`), and simulator statistics (`.stats`).

    Pass `workload=` to replay a `Workload` you built yourself (then trace/rate/arrival are
    ignored). `hardware=` takes the YAML mapping (gpu, num_gpus, pcie, nvlink, cpu, ...).
    `max_concurrency` makes the client closed-loop (`vllm bench serve --max-concurrency`);
    `workload_options` takes further workload keys, e.g. {"random_input_len": 1024} with
    trace="random", rate=float("inf").
    """
    hw = dict(hardware or {"gpu": gpu, "num_gpus": num_gpus})
    cfg = parse_experiment({
        "name": "simulate", "model": model, "hardware": hw,
        "workload": {"trace": trace, "num_requests": num_requests, "arrival": arrival,
                     "rates": [rate], "seeds": [seed], **(workload_options or {}),
                     **({"max_concurrency": max_concurrency} if max_concurrency else {})},
        "policies": [{"name": policy, **policy_params}],
        **({"slo": slo} if slo else {}),
    })
    pt = Point(cfg.policies[0], float(rate), int(seed))
    return run_point(cfg, pt, workload=workload)


def run_experiment(config: str | Path | dict | ExperimentConfig, *, overrides=(),
                   out: str | Path | None = None, progress: bool = False) -> pd.DataFrame:
    """Run every point of an experiment (YAML path, mapping or parsed config) and return one
    row of metrics per point; writes the results folder too when `out` is given."""
    if isinstance(config, ExperimentConfig):
        cfg = config
    elif isinstance(config, dict):
        cfg = parse_experiment(config)
    else:
        cfg = load_experiment(config, list(overrides))
    results = run_experiment_config(cfg, out=out, progress=progress)
    return pd.DataFrame([r.summary for r in results])
