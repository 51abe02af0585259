"""`summary.json` as `vllm bench serve --save-result` writes it: one JSON object per run (here
per point, one a line, as `--append-result` appends them), with vLLM's field names: `date`,
`backend`, `label`, `model_id`, `num_prompts`, `request_rate`, `burstiness` (the gamma shape
of the arrival gaps), `max_concurrency`, `duration`, `completed`, `failed`, the token counts
and throughputs, `request_goodput` (null without an SLO), and for each metric of
`percentile_metrics` (default ttft,tpot,itl) its mean, median, std and the
`metric_percentiles` (default 99) as `p99_ttft_ms`. Fields read from vLLM's
`vllm/benchmarks/serve.py`. simserve's identifying fields (policy, seed, gpu, ...) follow
as vLLM's `--metadata KEY=VALUE` pairs do; `summary.csv` keeps every simserve column.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from simserve.errors import ConfigError
from simserve.metrics import LATENCY_METRICS, PERCENTILES, p_word
from simserve.strict_json import strict_json

FORMATS = ("simserve", "vllm")
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")  # vLLM's default for generation
DEFAULT_METRIC_PERCENTILES = (99.0,)
METADATA = ("policy", "policy_name", "seed", "gpu", "num_gpus", "simserve_version")


def parse_percentile_metrics(text: str | None) -> tuple[str, ...]:
    if text is None:
        return DEFAULT_PERCENTILE_METRICS
    names = tuple(s.strip() for s in str(text).split(",") if s.strip())
    bad = [n for n in names if n not in LATENCY_METRICS]
    if bad or not names:
        raise ConfigError(f"--percentile-metrics {text!r}: expected a comma-separated subset "
                          f"of {','.join(LATENCY_METRICS)}")
    return names


def parse_metric_percentiles(text: str | None) -> tuple[float, ...]:
    if text is None:
        return DEFAULT_METRIC_PERCENTILES
    try:
        ps = tuple(float(s) for s in str(text).split(",") if s.strip())
    except ValueError:
        ps = ()
    if not ps or not all(0 < p < 100 for p in ps):
        raise ConfigError(f"--metric-percentiles {text!r}: expected comma-separated "
                          "percentiles between 0 and 100, e.g. 50,90,99")
    return ps


def extra_percentiles(percentiles) -> tuple[float, ...]:
    """The percentiles a run summary lacks (it has `metrics.PERCENTILES`)."""
    return tuple(p for p in percentiles if p not in PERCENTILES)


def burstiness(workload) -> float | None:
    """vLLM's `--burstiness`: the gamma shape k of the gaps (1 = Poisson; CV = 1/sqrt(k));
    None where the arrivals are a trace's own."""
    if workload.arrival == "poisson" or all(r == math.inf for r in workload.rates):
        return 1.0
    if workload.arrival == "gamma":
        return 1.0 / workload.burstiness_cv ** 2
    return None


def vllm_record(summary: dict, cfg, metrics, percentiles, version: str) -> dict:
    """One point's summary in vLLM's form."""
    dropped = int(summary.get("num_dropped", 0))
    out = {"date": summary.get("date"), "endpoint_type": "simserve", "backend": "simserve",
           "label": summary["policy"], "model_id": cfg.model, "tokenizer_id": cfg.model,
           "num_prompts": int(summary["num_requests"]) + dropped}
    meta = {**summary, "simserve_version": version}
    out.update({k: meta[k] for k in METADATA if k in meta})
    rate = summary["request_rate"]
    out.update({"request_rate": rate if rate < math.inf else "inf",
                "burstiness": burstiness(cfg.workload),
                "max_concurrency": summary.get("max_concurrency"),
                "duration": summary["duration"], "completed": summary["completed"],
                "failed": int(summary.get("num_unfinished", 0)) + dropped})
    for k in ("total_input_tokens", "total_output_tokens", "request_throughput"):
        out[k] = summary[k]
    out["request_goodput"] = summary.get("request_goodput") if cfg.slo else None
    for k in ("output_throughput", "total_token_throughput"):
        out[k] = summary[k]
    for m in metrics:
        for stat in ("mean", "median", "std"):
            out[f"{stat}_{m}_ms"] = summary[f"{stat}_{m}_ms"]
        for p in percentiles:
            out[f"p{p_word(p)}_{m}_ms"] = summary[f"p{p_word(p)}_{m}_ms"]
    return out


def vllm_lines(records: list[dict], cfg, metrics, percentiles) -> str:
    import simserve
    return "".join(json.dumps(strict_json(vllm_record(r, cfg, metrics, percentiles,
                                                      simserve.__version__)),
                              allow_nan=False) + "\n" for r in records)


@dataclass(frozen=True)
class SummaryFormat:
    """How `summary.json` is written: simserve's list of records (default) or vLLM's one
    object per point (`kind="vllm"`, with its `percentile_metrics` and `metric_percentiles`)."""
    kind: str = "simserve"
    percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS
    metric_percentiles: tuple[float, ...] = DEFAULT_METRIC_PERCENTILES

    def __post_init__(self) -> None:
        if self.kind not in FORMATS:
            raise ConfigError(f"--summary-format: expected one of {', '.join(FORMATS)}, got "
                              f"{self.kind!r}")

    @property
    def extra(self) -> tuple[float, ...]:
        """Percentiles the points must compute beyond the usual ones."""
        return extra_percentiles(self.metric_percentiles) if self.kind == "vllm" else ()

    @classmethod
    def from_options(cls, kind: str | None, metrics: str | None,
                     percentiles: str | None) -> SummaryFormat:
        if kind != "vllm" and (metrics is not None or percentiles is not None):
            raise ConfigError("--percentile-metrics / --metric-percentiles: only with "
                              "--summary-format vllm")
        return cls(kind or "simserve", parse_percentile_metrics(metrics),
                   parse_metric_percentiles(percentiles))
