"""Running an experiment: every point (policy × seed × rate), its metrics, and the results
folder (written to a temporary sibling, then moved in file by file with its marker, replacing
only simserve's own files: `storage.install`)."""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from simserve.errors import SimserveError
from simserve.runner.csv_chunks import csv_text
from simserve.runner.record_sink import RecordSink, label_frame
from simserve.runner.config import ExperimentConfig, PolicySpec
from simserve.runner.yamlio import line_of
from simserve.runner.vllm_summary import SummaryFormat, vllm_lines
from simserve.runner.provenance import marker, provenance, read_marker
from simserve.runner.storage import (claim_out, clean_stale_temp, install, os_error, out_lock,
                                     records_frame, staging, write_config, write_records)
from simserve.hardware.setup import resolve_hardware
from simserve.policies import check_hardware
from simserve.metrics import request_frame, summarize
from simserve.models import get_model
from simserve.run import SimResult, simulate_point
from simserve.workload.build import build_workload
from simserve.workload.spec import Workload

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Point:
    policy: PolicySpec
    rate: float
    seed: int


class PointResult:
    """One point's results: `summary` (metrics, vllm bench names, and identifying keys),
    `requests` (one row per request; None when streamed), `stats` (simulator statistics) and
    `timeseries` (per scheduling event: running, waiting, KV, tokens). The two frames may be
    handed in as zero-argument functions: they are built (and pandas imported) on first use,
    so a run that only prints its table never builds them."""

    def __init__(self, point: Point, summary: dict, requests, stats: dict, timeseries=None):
        self.point, self.summary, self.stats = point, summary, stats
        self._requests, self._timeseries = requests, timeseries

    @property
    def requests(self) -> pd.DataFrame | None:
        if callable(self._requests):
            self._requests = self._requests()
        return self._requests

    @property
    def timeseries(self) -> pd.DataFrame | None:
        if callable(self._timeseries):
            self._timeseries = self._timeseries()
        return self._timeseries

    def summary_frame(self) -> pd.DataFrame:
        import pandas as pd
        return pd.DataFrame([self.summary])

    def __repr__(self) -> str:
        return f"PointResult({self.point!r}, {self.summary!r})"


def points(cfg: ExperimentConfig) -> list[Point]:
    return [Point(p, float(r), int(s)) for p in cfg.policies for s in cfg.workload.seeds
            for r in cfg.workload.rates]


def make_workload(cfg: ExperimentConfig, rate: float, seed: int,
                  loaded: Workload | None = None) -> Workload:
    """The requests of one point; `loaded` is the trace file already parsed, if it is one
    (`workload.build.load_named_trace`: a sweep worker gets it from the submitting process)."""
    w = cfg.workload
    model = get_model(cfg.model)
    return build_workload(w.trace, num_requests=w.num_requests, arrival=w.arrival, rate=rate,
                          seed=seed, burstiness_cv=w.burstiness_cv,
                          max_context=w.max_context or model.max_context, start=w.start,
                          max_concurrency=w.max_concurrency, tile=w.tile, overlong=w.overlong,
                          loaded=loaded, zero_output=w.zero_output, **w.random_params())


def run_point(cfg: ExperimentConfig, pt: Point, hardware=None,
              workload: Workload | None = None, requests_sink: RecordSink | None = None,
              progress=False, trace_events=None, percentiles=()) -> PointResult:
    """One point. With `requests_sink` the run is streamed: per-request rows go to the sink in
    chunks as requests finish and `requests` is None (memory stays flat).
    `trace_events`: a path for the point's Chrome / Perfetto trace (`simulate_point`).
    `percentiles`: further latency percentiles for the summary (`metrics.more_percentiles`);
    not with a streamed run, which keeps no per-request latencies."""
    if percentiles and requests_sink is not None:
        raise SimserveError("percentiles other than 50, 90 and 99 need every request's "
                            "latency in memory; a streamed run (--stream, or 200,000 requests "
                            "a point) keeps only those three")
    hardware = hardware or resolve_hardware(cfg.hardware)
    wl = workload if workload is not None else make_workload(cfg, pt.rate, pt.seed)
    labels = (pt.policy.label, pt.rate, pt.seed)
    stream = digest = None
    if requests_sink is not None:
        from simserve.metrics_stream import RecordStream
        digest = requests_sink.digest(cfg.slo, labels, wl.num_requests)
        stream = RecordStream(cfg.slo, digest=digest)
    try:
        res: SimResult = simulate_point(wl, cfg.model, hardware, pt.policy.name,
                                        pt.policy.config, seed=pt.seed, stream=stream,
                                        progress=progress, trace_events=trace_events)
        hw = cfg.hardware
        summary = {"policy": pt.policy.label, "request_rate": pt.rate, "seed": pt.seed,
                   "num_requests": wl.num_requests, "num_capped": int(wl.num_capped),
                   "num_dropped": int(wl.num_dropped),
                   **({"num_zero_output": int(wl.meta["num_zero_output"])}
                      if wl.meta.get("num_zero_output") else {}),
                   "max_concurrency": wl.max_concurrency, "model": cfg.model, "gpu": hw.gpu,
                   "num_gpus": hw.num_gpus, "policy_name": pt.policy.name,
                   "policy_options": dataclasses.asdict(pt.policy.config), "date": run_date()}
        if res.stats.get("counters"):         # CPU-tier policies: the mechanism at work
            summary["counters"] = res.stats["counters"]
        if stream is not None:
            summary.update(stream.summary())
    finally:
        if digest is not None:
            digest.close()  # a digest process: stopped if the run failed before its result
    if stream is not None:
        summary.update(res.stats.get("prefix_cache_summary", {}))
        return PointResult(pt, summary, None, res.stats, res.recorder.frame)
    summary.update(summarize(res.records, cfg.slo))
    if percentiles:
        from simserve.metrics import more_percentiles
        summary.update(more_percentiles(res.records, percentiles))
    summary.update(res.stats.get("prefix_cache_summary", {}))
    records = res.records
    return PointResult(pt, summary, lambda: label_frame(request_frame(records, cfg.slo), labels),
                       res.stats, res.recorder.frame)


def run_date(epoch: str | None = None) -> str:
    """When a point ran, as `vllm bench serve` dates its results (%Y%m%d-%H%M%S, UTC here).
    SOURCE_DATE_EPOCH (seconds; or `epoch`, the submitting process's, in a sweep worker) pins
    it, for byte-identical reruns."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH") if epoch is None else epoch
    t = datetime.fromtimestamp(int(epoch), timezone.utc) if epoch and epoch.isdigit() \
        else datetime.now(timezone.utc)
    return t.strftime("%Y%m%d-%H%M%S")


STREAM_MIN_REQUESTS = 200_000  # points this large stream their per-request records to disk
POINT_BAR_MIN_REQUESTS = 20_000  # points this large get a bar of their own (finished requests)


def validate(cfg: ExperimentConfig) -> Workload:
    """Everything that can fail before a run: hardware names, the trace, the first workload
    (returned)."""
    resolve_hardware(cfg.hardware)
    for spec in cfg.policies:
        try:
            check_hardware(spec.config, cfg.hardware)
        except SimserveError as exc:
            raise type(exc)(f"{cfg.source}: {exc} (policy {spec.label})" if cfg.source
                            else f"{exc} (policy {spec.label})") from None
    try:
        return make_workload(cfg, cfg.workload.rates[0], cfg.workload.seeds[0])
    except SimserveError as exc:
        raise type(exc)(_at_workload_key(cfg, str(exc))) from None


def _at_workload_key(cfg: ExperimentConfig, msg: str) -> str:
    """`msg` with the file and line of the workload key it starts with (`num_requests: ...`
    -> `exp.yaml:7: workload.num_requests: ...`), when the config came from a file."""
    key = msg.split(":", 1)[0]
    wl = cfg.raw.get("workload") if isinstance(cfg.raw, dict) else None
    if not cfg.source or not isinstance(wl, dict) or key not in wl:
        return msg
    ln = line_of(wl, key)
    return f"{cfg.source}:{ln}: workload.{msg}" if ln else f"{cfg.source}: workload.{msg}"


def run_experiment_config(cfg: ExperimentConfig, out: str | Path | None = None,
                          progress: bool = True, stream: bool | None = None,
                          trace_events: str | Path | None = None,
                          overwrite: bool = False, workload: Workload | None = None,
                          summary: SummaryFormat | None = None,
                          adopt: bool = False) -> list[PointResult]:
    """Every point of `cfg`; with `out`, the results folder too, written while holding the
    folder's lock (a second run into the same `out` at the same time is refused). `out` must
    be new, empty, or simserve's own run results (`storage.claim_out`; `overwrite` takes any
    folder over; `adopt` a run folder an older simserve wrote without a marker); only
    simserve's files there are replaced, anything else stays.
    `trace_events`: where each point's Chrome / Perfetto trace goes (`trace_path`).
    `workload`: the requests of every point (a user's own), instead of `cfg`'s trace.
    `summary`: summary.json's form (`vllm_summary.SummaryFormat`; simserve's by default)."""
    extra = {"workload": workload, "summary": summary or SummaryFormat()}
    if out is None:
        return _run_experiment_config(cfg, None, progress, stream, trace_events, **extra)
    out = Path(out)
    with out_lock(out):
        old = claim_out(out, "run", overwrite, adopt)
        try:
            clean_stale_temp(out)
            return _run_experiment_config(cfg, out, progress, stream, trace_events, old,
                                          **extra)
        except OSError as exc:
            raise os_error(out, exc) from None


def trace_path(base: str | Path, pt: Point, many: bool) -> Path:
    """The trace file of one point: `base` itself for a single point, else base's name with
    the point's policy, rate and seed before its suffix (trace-vllm-4req_s-seed0.json)."""
    base = Path(base)
    if not many:
        return base
    suffix = base.suffix or ".json"
    return base.with_name(f"{base.stem}-{pt.policy.label}-{pt.rate:g}req_s-seed{pt.seed}"
                          f"{suffix}")


def _run_experiment_config(cfg: ExperimentConfig, out: str | Path | None = None,
                          progress: bool = True, stream: bool | None = None,
                          trace_events: str | Path | None = None,
                          old_marker: dict | None = None, workload: Workload | None = None,
                          summary: SummaryFormat | None = None) -> list[PointResult]:
    """Every point; results written to `out` when given. `stream` (default: points of
    `STREAM_MIN_REQUESTS` requests or more) writes per-request rows to out/requests.csv in
    chunks while points run instead of holding them (PointResult.requests is then None)."""
    summary = summary or SummaryFormat()
    if workload is None:
        first = validate(cfg)
    else:
        resolve_hardware(cfg.hardware)
        first = workload
    if stream is None:
        stream = first.num_requests >= STREAM_MIN_REQUESTS
    hardware = resolve_hardware(cfg.hardware)
    pts = points(cfg)
    if trace_events is not None and not Path(trace_events).resolve().parent.is_dir():
        raise SimserveError(f"--trace-events {trace_events}: no such folder "
                            f"{Path(trace_events).parent}")
    point_bar = progress and first.num_requests >= POINT_BAR_MIN_REQUESTS
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(pts), desc=cfg.name, unit="point", file=sys.stderr, leave=False)

    def run_all(sink) -> list[PointResult]:
        results = []
        try:
            for pt in pts:
                if bar:
                    bar.set_postfix_str(f"{pt.policy.label} rate={pt.rate:g} seed={pt.seed}")
                trace = None if trace_events is None else \
                    trace_path(trace_events, pt, len(pts) > 1)
                same = workload is not None or \
                    (pt.rate, pt.seed) == (cfg.workload.rates[0], cfg.workload.seeds[0])
                results.append(run_point(cfg, pt, hardware, workload=first if same else None,
                                         requests_sink=sink, progress=point_bar,
                                         trace_events=trace, percentiles=summary.extra))
                if bar:
                    bar.update()
        finally:
            if bar:
                bar.close()
        return results

    if not stream:
        results = run_all(None)
        if out is not None:
            write_results(cfg, results, Path(out), old_marker, summary)
        return results
    if out is None:
        return run_all(RecordSink(None))
    with staging(Path(out)) as tmp:
        results = run_all(RecordSink(tmp / "requests.csv"))
        _write_summary_files(tmp, cfg, results, summary)
        install(tmp, Path(out), run_marker(cfg), old_marker)
    return results


def summary_records(results: list[PointResult]) -> list[dict]:
    return [r.summary for r in results]


def write_results(cfg: ExperimentConfig, results: list[PointResult], out: Path,
                  old_marker: dict | None = None, summary: SummaryFormat | None = None) -> Path:
    """Write summary.json, summary.csv, requests.csv, config.yaml (resolved) with its hash,
    into a temporary sibling folder, then move them into `out` with the marker
    (`storage.install`: of what `out` held, only simserve's files listed in `old_marker`, or
    else in out's own marker, are replaced or removed)."""
    import pandas as pd
    if old_marker is None:
        old_marker = read_marker(out)
    with staging(out) as tmp:
        with open(tmp / "requests.csv", "w", newline="") as f:
            f.write(csv_text(pd.concat([r.requests for r in results], ignore_index=True)))
        _write_summary_files(tmp, cfg, results, summary)
        install(tmp, out, run_marker(cfg), old_marker)
    return out


def run_marker(cfg: ExperimentConfig) -> dict:
    """The marker of a run's results folder (`provenance.marker`)."""
    return marker("run", provenance(cfg), [], complete=True, points=len(points(cfg)))


def _write_summary_files(tmp: Path, cfg: ExperimentConfig, results: list[PointResult],
                         summary: SummaryFormat | None = None) -> None:
    recs = summary_records(results)
    if summary is not None and summary.kind == "vllm":
        (tmp / "summary.json").write_text(vllm_lines(recs, cfg, summary.percentile_metrics,
                                                     summary.metric_percentiles))
    else:
        write_records(tmp / "summary.json", recs)
    records_frame(recs).to_csv(tmp / "summary.csv", index=False)
    write_config(tmp / "config.yaml", cfg.resolved(),
                 f"resolved config of {cfg.source}; sha256[:16] of it and its hardware "
                 f"profiles = {cfg.hash()}")
    (tmp / "config.sha256").write_text(cfg.hash() + "\n")


TABLE_COLUMNS = [
    ("policy", "policy", None), ("request_rate", "rate req/s", "{:g}"),
    ("max_concurrency", "max conc.", "{:d}"),
    ("mean_ttft_ms", "TTFT mean s", "s"), ("p99_ttft_ms", "TTFT p99 s", "s"),
    ("p99_itl_ms", "ITL p99 s", "s"), ("mean_tpot_ms", "TPOT mean s", "s"),
    ("p99_tpot_ms", "TPOT p99 s", "s"), ("mean_normalized_latency_s", "norm lat s/tok", "{:.3f}"),
    ("output_throughput", "out tok/s", "{:.0f}"), ("slo_attainment", "SLO att.", "{:.1%}"),
    ("request_goodput", "goodput req/s", "{:.2f}"),
]


def format_table(recs: list[dict], slo=None) -> str:
    """The run table, with a footer saying its units and the SLO it was judged by."""
    cols = [c for c in TABLE_COLUMNS if any(r.get(c[0]) is not None for r in recs)]
    rows = [[h for _, h, _ in cols]]
    for r in recs:
        row = []
        for key, _, fmt in cols:
            v = r.get(key)
            if v is None:
                row.append("-")
            elif fmt == "s":
                row.append(f"{v / 1000:.3f}")
            elif fmt:
                row.append(fmt.format(v))
            else:
                row.append(str(v))
        rows.append(row)
    widths = [max(len(x[i]) for x in rows) for i in range(len(cols))]
    lines = ["  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n" + table_footer(slo)


def table_footer(slo) -> str:
    """Two lines under a run table: its units and the SLO ("varies": one per sweep point)."""
    units = ("units: TTFT, ITL, TPOT in s (from the request's send time); norm lat = E2E / "
             "output tokens; rate, goodput in req/s; out tok/s = output tokens per s")
    if slo == "varies":
        return units + "\nSLO: varies by point (see each point's config.yaml)"
    return units + "\n" + (f"SLO: {slo.describe()}" if slo is not None else
                           "SLO: none (add slo: {ttft_ms, tbt_ms} to judge attainment and goodput)")


def check_out_dir(out: Path, overwrite: bool = False, adopt: bool = False) -> None:
    """Fail before running when `run` may not write its results at `out` (`claim_out`)."""
    claim_out(out, "run", overwrite, adopt)
