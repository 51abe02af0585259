"""`simserve run FILE [--set key=value ...] [--out DIR]`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simserve.runner.config import load_experiment
from simserve.runner.storage import os_error
from simserve.runner.point import (check_out_dir, format_table, run_experiment_config,
                                   summary_records)


def _run(args: argparse.Namespace) -> int:
    try:
        return _run_checked(args)
    except OSError as exc:  # e.g. --trace-events into a full or read-only folder
        raise os_error(args.out or "results", exc) from None


def _run_checked(args: argparse.Namespace) -> int:
    from simserve.runner.vllm_summary import SummaryFormat
    summary = SummaryFormat.from_options(args.summary_format, args.percentile_metrics,
                                         args.metric_percentiles)
    cfg = load_experiment(args.file, args.set or [])
    out = Path(args.out) if args.out else Path("results") / cfg.name
    if not args.no_save:
        check_out_dir(out, args.overwrite, args.adopt)  # a refused folder costs no time
    before = _stored_hash(out)
    results = run_experiment_config(cfg, out=None if args.no_save else out,
                                     progress=not args.quiet, stream=args.stream or None,
                                     trace_events=args.trace_events, overwrite=args.overwrite,
                                     summary=summary, adopt=args.adopt)
    recs = summary_records(results)
    print(f"{cfg.name}: {cfg.model} on {cfg.hardware.num_gpus}x {cfg.hardware.gpu}, "
          f"{cfg.workload.trace} ({results[0].summary['num_requests']} requests, "
          f"{cfg.workload.arrival} arrivals"
          + (f", at most {cfg.workload.max_concurrency} in flight"
             if cfg.workload.max_concurrency else "") + "); times in seconds")
    print(format_table(recs, cfg.slo))
    from simserve.accuracy import accuracy_lines   # how far from the real engine
    for line in accuracy_lines(recs):
        print(line)
    capped = max(r["num_capped"] for r in recs)
    if capped:
        print(f"note: {capped} request(s) per point were capped at the model's max context")
    dropped = max(r.get("num_dropped", 0) for r in recs)
    if dropped:
        print(f"note: {dropped} request(s) per point were dropped: prompt + output exceeds the "
              "max context (workload.overlong: drop; 'cap' shortens them instead)")
    if args.trace_events:
        print(f"timeline: {args.trace_events}" + (" (one file per point, named after it)"
                                                   if len(recs) > 1 else "")
              + ": open it in https://ui.perfetto.dev or chrome://tracing")
    if not args.no_save:
        print(f"\nresults: {out}/ (summary.json, summary.csv, requests.csv, config.yaml)")
        if before and before != cfg.hash():
            print(f"note: replaced earlier results of another config ({before}) in {out}/",
                  file=sys.stderr)
    return 0


def _stored_hash(out: Path) -> str | None:
    try:
        return (out / "config.sha256").read_text().strip() or None
    except OSError:
        return None


def register(sub) -> None:
    p = sub.add_parser("run", help="run an experiment YAML and print its metrics table")
    p.add_argument("file", help="experiment YAML, or the name of one shipped with simserve (quickstart)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config value, e.g. --set workload.rates=[2,4] "
                        "--set policies.0.max_num_batched_tokens=4096")
    p.add_argument("--out", help="results folder (default results/NAME)")
    p.add_argument("--no-save", action="store_true", help="print the table only")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a folder simserve did not make (or a sweep's): its own "
                        "files there (summary.*, requests.csv, config.*) are replaced, every "
                        "other file is left as it is")
    p.add_argument("--adopt", action="store_true",
                   help="take over a run folder written by a simserve older than its "
                        ".simserve.json marker (recognised by its layout; refused if it holds "
                        "anything else)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--stream", action="store_true",
                   help="write per-request rows to requests.csv in chunks as requests finish "
                        "instead of holding them (on by itself for points of 200,000 requests "
                        "or more)")
    p.add_argument("--trace-events", metavar="FILE",
                   help="write a Chrome / Perfetto trace of every iteration and transfer (a "
                        "track per engine, rank, CPU engine and link); with several points, one "
                        "file each, named FILE-POLICY-RATEreq_s-seedSEED.json")
    p.add_argument("--summary-format", choices=("simserve", "vllm"), default=None,
                   help="summary.json as simserve's list of records (default) or as `vllm "
                        "bench serve --save-result` writes it: one JSON object per point, one "
                        "a line (summary.csv keeps every column either way)")
    p.add_argument("--percentile-metrics", metavar="LIST",
                   help="with --summary-format vllm: metrics whose mean, median, std and "
                        "percentiles it holds, from ttft,tpot,itl,e2el (default ttft,tpot,itl)")
    p.add_argument("--metric-percentiles", metavar="LIST",
                   help="with --summary-format vllm: percentiles, e.g. 50,90,99 (default 99)")
    p.set_defaults(handler=_run)
