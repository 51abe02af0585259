"""The Python API a notebook uses: `simulate` one point, `run_experiment` a whole YAML,
`load_results` a results folder back."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from simserve.runner.config import ExperimentConfig, load_experiment, parse_experiment
from simserve.runner.point import PointResult, Point, run_experiment_config, run_point
from simserve.workload.build import USER_WORKLOAD
from simserve.workload.spec import Workload
from simserve.workload.user import apply_options, mean_rate, refuse_other_options

_DEFAULT = object()  # an argument left out (None means something for num_requests)


def simulate(policy: str = "vllm", *, model: str = "llama-3.1-8b", gpu: str = "h100-sxm",
             num_gpus: int = 1, trace: str | None = None, num_requests=_DEFAULT,
             rate: float | None = None, arrival: str | None = None, seed: int = 0,
             slo: dict | None = None, workload: Workload | None = None,
             hardware: dict | None = None, max_concurrency: int | None = None,
             workload_options: dict | None = None, **policy_params) -> PointResult:
    """Simulate one point and return its per-request DataFrame (`.requests`), its metrics
    (`.summary`, a dict; `.summary_frame()`), and simulator statistics (`.stats`).

    Without `workload=`: `trace` (default synthetic-conversation), `num_requests` (default
    2000), `rate` (default 4 req/s) and `arrival` (default poisson) make the requests.
    `workload=` replays a `Workload` you built yourself: `num_requests`, `max_concurrency`
    and `workload_options` {"start", "tile"} apply to it; trace, rate, arrival and the other
    workload options describe generated requests and are refused. Its rate in the summary is
    its own mean rate. `hardware=` takes the YAML mapping (gpu, num_gpus, pcie, nvlink, cpu,
    ...). `max_concurrency` makes the client closed-loop (`vllm bench serve
    --max-concurrency`); `workload_options` takes further workload keys, e.g.
    {"random_input_len": 1024} with trace="random", rate=float("inf"). Every value is checked
    as the experiment YAML's is.
    """
    hw = dict(hardware or {"gpu": gpu, "num_gpus": num_gpus})
    extra = dict(workload_options or {})
    if num_requests is not _DEFAULT:
        extra["num_requests"] = num_requests
    if max_concurrency is not None:
        extra["max_concurrency"] = max_concurrency
    if workload is not None:
        given = [k for k, v in (("trace", trace), ("rate", rate), ("arrival", arrival))
                 if v is not None]
        refuse_other_options(given + list(extra), "simulate: ")
        wl = {"seeds": [seed], **extra}
    else:
        wl = {"trace": trace or "synthetic-conversation",
              "num_requests": 2000 if num_requests is _DEFAULT else num_requests,
              "arrival": arrival or "poisson", "rates": [4.0 if rate is None else rate],
              "seeds": [seed], **extra}
    cfg = parse_experiment({
        "name": "simulate", "model": model, "hardware": hw, "workload": wl,
        "policies": [{"name": policy, **policy_params}], **({"slo": slo} if slo else {}),
    }, "simulate()")
    if workload is None:
        return run_point(cfg, Point(cfg.policies[0], float(cfg.workload.rates[0]), int(seed)))
    cfg, w = _with_user_workload(cfg, workload, set(extra))
    return run_point(cfg, Point(cfg.policies[0], cfg.workload.rates[0], int(seed)),
                     workload=w)


def _with_user_workload(cfg: ExperimentConfig, workload: Workload,
                        given: set[str]) -> tuple[ExperimentConfig, Workload]:
    """The user's Workload with the config's honoured options applied, and the config saying
    what ran (its trace named after the Workload, its rate the Workload's mean rate)."""
    wc = cfg.workload
    w = apply_options(workload, num_requests=wc.num_requests if "num_requests" in given
                      else None, start=wc.start, tiles=wc.tile,
                      max_concurrency=wc.max_concurrency)
    wc = dataclasses.replace(wc, trace=f"{USER_WORKLOAD}{w.name}>", rates=(mean_rate(w),),
                             arrival="trace", num_requests=w.num_requests,
                             max_concurrency=w.max_concurrency)
    return dataclasses.replace(cfg, workload=wc), w


def run_experiment(config: str | Path | dict | ExperimentConfig, *, overrides=(),
                   out: str | Path | None = None, progress: bool = False,
                   workload: Workload | None = None, summary_format: str | None = None,
                   percentile_metrics: str | None = None,
                   metric_percentiles: str | None = None,
                   overwrite: bool = False) -> pd.DataFrame:
    """Run every point of an experiment (YAML path, mapping or parsed config) and return one
    row of metrics per point; writes the results folder too when `out` is given. `out` must
    be new, empty or simserve's own run results; `overwrite=True` writes into any folder,
    replacing only simserve's own files there (as `simserve run --overwrite`).

    `workload=`: replay a `Workload` you built instead of the YAML's trace; the workload
    section may then hold only num_requests, start, tile, max_concurrency and seeds (as
    `simulate` takes them), and each policy × seed is one point.
    `summary_format="vllm"` (with `percentile_metrics="ttft,tpot,itl,e2el"`,
    `metric_percentiles="50,90,99"`, as `vllm bench serve` takes them) writes `out`'s
    summary.json as vLLM does; the returned frame holds the extra percentiles too."""
    from simserve.runner.vllm_summary import SummaryFormat
    fmt = SummaryFormat.from_options(summary_format, percentile_metrics, metric_percentiles)
    if isinstance(config, ExperimentConfig):
        cfg = config
    elif isinstance(config, dict):
        cfg = parse_experiment(config)
    else:
        cfg = load_experiment(config, list(overrides))
    if workload is not None:
        raw = cfg.raw.get("workload") if isinstance(cfg.raw, dict) else None
        given = set(raw) if isinstance(raw, dict) else set()
        refuse_other_options(sorted(given), f"{cfg.source}: workload.")
        cfg, workload = _with_user_workload(cfg, workload, given)
    results = run_experiment_config(cfg, out=out, progress=progress, workload=workload,
                                    summary=fmt, overwrite=overwrite)
    return pd.DataFrame([r.summary for r in results])


def load_results(path: str | Path):
    """A results folder of `simserve run` or `simserve sweep` as frames; see
    `simserve.runner.results.load_results`."""
    from simserve.runner.results import load_results as load
    return load(path)
