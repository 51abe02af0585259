"""`simserve plot RESULTS [--out DIR] [--slo TTFT_MS,TBT_MS] [--target EXPR ...]`: latency and
attainment against rate with targets and sustainable rates, and a token timeline of one point."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from simserve.errors import SimserveError
from simserve.capacity import (Target, group_keys, group_label,
                               load_records, parse_target, rate_curves)
from simserve.metrics import sustainable_rate
from simserve.runner import comparison, trace_plot

FORMATS = ("png", "svg", "pdf")


def _read_yaml(f: Path) -> dict:
    import yaml
    try:
        data = yaml.safe_load(f.read_text())
    except (yaml.YAMLError, OSError):
        return {}
    return data if isinstance(data, dict) else {}


def _config(results: Path, records: list[dict], limit: int = 200) -> dict:
    """The resolved config of a `simserve run` folder; for a sweep, what its points'
    configs agree on (name, model, hardware, workload, slo fields; at most `limit` read)."""
    if (results / "config.yaml").exists():
        return _read_yaml(results / "config.yaml")
    keys = list(dict.fromkeys(str(r["point"]) for r in records if r.get("point")))[:limit]
    cfgs = [c for c in (_read_yaml(results / "points" / k / "config.yaml") for k in keys) if c]
    if not cfgs:
        return {}
    out: dict = {}
    for top in ("name", "model"):
        if len({str(c.get(top)) for c in cfgs}) == 1:
            out[top] = cfgs[0].get(top)
    for sec in ("hardware", "workload", "slo"):
        first = cfgs[0].get(sec) or {}
        same = {k: v for k, v in first.items()
                if all((c.get(sec) or {}).get(k) == v for c in cfgs)}
        if same:
            out[sec] = same
    return out


def _slo(args, cfg: dict) -> tuple[float, float] | None:
    if args.slo:
        try:
            ttft, tbt = (float(x) for x in args.slo.split(","))
        except ValueError:
            raise SimserveError(f"--slo {args.slo!r}: expected TTFT_MS,TBT_MS, e.g. 5000,1500")
        if not (ttft > 0 and tbt > 0):
            raise SimserveError(f"--slo {args.slo!r}: both must be positive")
        return ttft, tbt
    slo = cfg.get("slo") or {}
    if slo.get("ttft_ms") is not None and slo.get("tbt_ms") is not None:
        return float(slo["ttft_ms"]), float(slo["tbt_ms"])
    return None


def panel_targets(slo, extra: list[Target]) -> list[Target]:
    """One target per panel: the SLO's TTFT and TBT (DualPace's 5 s / 1.5 s without one),
    1 s/token normalized latency, 95 % attainment; --target replaces the one on its metric."""
    ttft, tbt = slo or (5000.0, 1500.0)
    ts = {t.metric: t for t in [
        Target("mean_normalized_latency_s", "<=", 1.0), Target("p99_ttft_ms", "<=", ttft),
        Target("p99_itl_ms", "<=", tbt), Target("p99_tpot_ms", "<=", tbt),
        Target("slo_attainment", ">=", 0.95)]}
    for t in extra:
        ts[t.metric] = t
    return list(ts.values())


def _title(cfg: dict, results: Path) -> str:
    """'name: model on N× gpu, trace, K requests', leaving out what a sweep varies."""
    hw, wl = cfg.get("hardware") or {}, cfg.get("workload") or {}
    parts = []
    if cfg.get("model"):
        parts.append(cfg["model"] + (f" on {hw.get('num_gpus', 1)}× {hw['gpu']}"
                                     if hw.get("gpu") else ""))
    if wl.get("trace"):
        parts.append(str(wl["trace"]))
    if wl.get("num_requests"):
        parts.append(f"{wl['num_requests']} requests")
    name = cfg.get("name") or results.name
    return f"{name}: {', '.join(parts)}" if parts else name


def _save(fig, out: Path, stem: str, formats, title: str | None = None) -> list[Path]:
    """Write `fig` as out/stem.FORMAT for each format and close it; with `title`, the
    results' title above the panels first (a figure without constrained layout)."""
    import matplotlib.pyplot as plt

    from simserve.plots import declutter
    if title is not None:
        fig.suptitle(title, fontsize=10, color="0.3")
        fig.tight_layout()
    declutter(fig)
    paths = []
    for fmt in formats:
        p = out / f"{stem}.{fmt}"
        fig.savefig(p, dpi=150, bbox_inches="tight")
        paths.append(p)
    plt.close(fig)
    return paths


def timeline_rate(records, ttft_target: Target | None) -> float:
    """The first measured rate at which some curve misses the P99 TTFT target (where the
    timelines part ways); else the middle rate."""
    have = sorted({float(r["request_rate"]) for r in records})
    if ttft_target is not None and any(ttft_target.metric in r for r in records):
        caps = [sustainable_rate(c.rates, c.values, ttft_target.value)
                for c in rate_curves(records, ttft_target.metric)]
        exact = [r for r, cens in caps if not cens]
        above = [r for r in have if exact and r >= min(exact)]
        if above:
            return above[0]
    return have[len(have) // 2]


def timeline_points(results: Path, records: list[dict], rate: float, seed) -> list[tuple]:
    """(label, requests frame, config.yaml, policy label) per curve at one rate and seed: from
    RESULTS/requests.csv (`simserve run`) or from a sweep's points/<hash>/ folders."""
    import pandas as pd
    at = [r for r in records if math.isclose(float(r["request_rate"]), rate)
          and r.get("seed", 0) == seed]
    keys = group_keys(records)
    out = []
    if (results / "requests.csv").exists():
        req = pd.read_csv(results / "requests.csv")
        req = req[np.isclose(req["request_rate"].astype(float), rate) & (req["seed"] == seed)]
        for r in at:
            sel = req["policy"] == r["policy"]
            for k in keys[1:]:  # narrow by curve fields the CSV has
                if k in req.columns:
                    sel &= req[k] == r[k]
            out.append((group_label({k: r.get(k) for k in keys if k in r}), req[sel],
                        results / "config.yaml", r["policy"]))
    else:
        for r in at:
            folder = results / "points" / str(r.get("point"))
            if (folder / "requests.csv").exists():
                out.append((group_label({k: r.get(k) for k in keys if k in r}),
                            pd.read_csv(folder / "requests.csv"), folder / "config.yaml",
                            r["policy"]))
    return [x for x in out if not x[1].empty]


def exact_token_times(config: Path, policy: str, rate: float, seed, frame, _hw={}):
    """Every token time of one policy at one point, re-simulated from its resolved config.yaml;
    None unless the rerun reproduces `frame` (requests.csv: first-token and finish times)."""
    from simserve.runner.config import load_experiment
    from simserve.runner.point import make_workload
    from simserve.hardware.setup import resolve_hardware
    from simserve.run import simulate_point
    try:
        cfg = load_experiment(config)
        pol = next(p for p in cfg.policies if p.label == policy)
        if cfg.hardware not in _hw:
            _hw[cfg.hardware] = resolve_hardware(cfg.hardware)
        wl = make_workload(cfg, rate, int(seed))
        rec = simulate_point(wl, cfg.model, _hw[cfg.hardware], pol.name, pol.config,
                             seed=int(seed)).records
    except (SimserveError, OSError, StopIteration):
        return None
    ok = len(frame) == len(rec.first_token_s) and all(
        np.allclose(frame[c].to_numpy(float), getattr(rec, c), rtol=1e-6, equal_nan=True)
        for c in ("first_token_s", "finish_s"))
    return rec.token_times_s if ok else None


def _plot(args: argparse.Namespace) -> int:
    import matplotlib
    matplotlib.use("Agg")
    if args.trace_events or (args.results and trace_plot.is_point_folder(Path(args.results))):
        return _plot_timeline(args)
    if not args.results:
        raise SimserveError("simserve plot: give a RESULTS folder or --trace-events FILE")
    results = Path(args.results)
    if not results.is_dir():
        raise SimserveError(f"{results}: expected a results folder (with summary.json)")
    records = load_records(results)
    cfg = _config(results, records)
    formats = _formats(args)
    targets = panel_targets(_slo(args, cfg), [parse_target(t) for t in args.target or []])
    available = {k for r in records for k in r}
    targets = [t for t in targets if t.metric in available]
    records, caps, styles = comparison.select(records, targets, args.all_variants)
    ttft = next((t for t in targets if t.metric == "p99_ttft_ms"), None)
    rate = args.timeline_rate if args.timeline_rate else timeline_rate(records, ttft)
    seeds = sorted({r.get("seed", 0) for r in records})
    seed = args.seed if args.seed is not None else seeds[0]
    pts = timeline_points(results, records, rate, seed)
    if not pts and (args.timeline_rate is not None or args.seed is not None):
        have = ", ".join(f"{r:g}" for r in sorted({float(r["request_rate"]) for r in records}))
        raise SimserveError(f"--timeline-rate {rate:g} --seed {seed}: no requests of that point "
                            f"in {results} (rates: {have}; seeds: {seeds})")
    out = Path(args.out) if args.out else results / "plots"
    out.mkdir(parents=True, exist_ok=True)
    title = _title(cfg, results)
    save = lambda fig, stem, suptitle=None: _save(fig, out, stem, formats, suptitle)
    written = _latency_figure(records, targets, available, caps, styles, title, save)
    written += _attainment_figure(records, targets, cfg, caps, styles, title, save)
    if pts:
        written += _timeline_figure(pts, rate, seed, args.approx_timeline, styles, title, save)
    else:
        print(f"note: no per-request results (requests.csv) in {results}; no token timeline")
    for p in written:
        print(p)
    return 0


def _latency_figure(records, targets, available, caps, styles, title, save) -> list[Path]:
    """Latency metrics against rate, two panels a row, the targets' metrics after the defaults."""
    import matplotlib.pyplot as plt

    from simserve import plots
    metrics = list(plots.LATENCY_PANELS) + [t.metric for t in targets if t.metric not in
                                            plots.LATENCY_PANELS and t.metric != "slo_attainment"]
    metrics = [m for m in metrics if m in available]
    fig = plt.figure(figsize=(11.5, 4.3 * math.ceil(len(metrics) / 2) + 0.8),
                     layout="constrained")
    plots.latency_panels(records, fig, metrics=metrics, targets=targets, capacities=caps,
                         styles=styles, title=f"Latency vs request rate — {title}")
    return save(fig, "latency")


def _attainment_figure(records, targets, cfg, caps, styles, title, save) -> list[Path]:
    """SLO attainment against rate, when a target asks for it; else nothing."""
    import matplotlib.pyplot as plt

    from simserve import plots
    att = [t for t in targets if t.metric == "slo_attainment"]
    if not att:
        return []
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    plots.attainment_vs_rate(records, ax, target=att[0], capacities=caps, styles=styles)
    run_slo = cfg.get("slo") or {}  # attainment was measured against the run's own SLO
    if run_slo.get("tbt_ms") is not None:
        ax.set_title(f"SLO attainment — TTFT {run_slo['ttft_ms'] / 1e3:g} s, "
                     f"TBT {run_slo['tbt_ms']:g} ms per-token deadlines", fontsize=11)
    elif run_slo:
        within = ", ".join(f"{k[:-3].upper()} {v:g} ms" for k, v in run_slo.items()
                           if v is not None)
        ax.set_title(f"SLO attainment — vLLM goodput: {within}", fontsize=11)
    return save(fig, "attainment", title)


def _timeline_figure(pts, rate, seed, approx, styles, title, save) -> list[Path]:
    """Generated tokens over time of one (rate, seed) point, one line per policy: exact token
    times from a re-simulation unless `approx`, else estimated from the per-request rows."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from simserve import plots
    frame = pd.concat([f.assign(_label=lab) for lab, f, _, _ in pts], ignore_index=True)
    exact = {}
    if not approx:
        for lab, f, config, policy in pts:
            t = exact_token_times(config, policy, rate, seed, f)
            if t is not None:
                exact[lab] = t
    fig, ax = plt.subplots(figsize=(9, 5))
    plots.token_timeline(frame, ax, token_times=exact, by="_label", styles=styles)
    ax.set_title(f"Generated tokens over time at {rate:g} req/s (seed {seed})", fontsize=12)
    return save(fig, "timeline", title)


def _formats(args) -> list[str]:
    formats = [f.strip().lower() for f in args.format.split(",") if f.strip()]
    for f in formats:
        if f not in FORMATS:
            raise SimserveError(f"--format {f!r}: expected some of {', '.join(FORMATS)}")
    return formats


def _plot_timeline(args) -> int:
    """One point's Gantt timeline: from --trace-events FILE, or a sweep point folder
    re-simulated with a trace (written beside the figure as trace.json)."""
    formats, window = _formats(args), trace_plot.parse_window(args.window)
    if args.trace_events:
        trace = Path(args.trace_events)
        if not trace.is_file():
            raise SimserveError(f"--trace-events {trace}: no such file")
        out = Path(args.out) if args.out else trace.parent
    else:
        folder = Path(args.results)
        out = Path(args.out) if args.out else folder / "plots"
        out.mkdir(parents=True, exist_ok=True)
        trace = trace_plot.trace_point(folder, out / "trace.json")
    for p in trace_plot.draw(trace, out, formats, window):
        print(p)
    return 0


def register(sub) -> None:
    p = sub.add_parser("plot", help="plot latency / SLO attainment vs rate and token timelines",
                       description="Figures of a results folder: latency vs rate per policy "
                       "(targets and sustainable rates marked), SLO attainment vs rate, and "
                       "cumulative generated tokens over time at one point.")
    p.add_argument("results", metavar="RESULTS", nargs="?",
                   help="results folder (summary.json, requests.csv, config.yaml as `simserve "
                        "run` writes them), or a sweep point folder (points/<hash>/: its "
                        "timeline, re-simulated with a trace)")
    p.add_argument("--trace-events", metavar="FILE",
                   help="draw this trace (`simserve run --trace-events`) as a timeline, a row "
                        "per engine, rank and link (trace.png; default beside FILE)")
    p.add_argument("--all-variants", action="store_true",
                   help="draw every swept variant of a design (default: its best one, by "
                        "attainment, else P99 TTFT, else normalized latency)")
    p.add_argument("--window", metavar="T0,T1", help="timeline: only simulated seconds T0-T1")
    p.add_argument("--out", help="folder for the figures (default RESULTS/plots)")
    p.add_argument("--slo", metavar="TTFT_MS,TBT_MS",
                   help="lines on the P99 TTFT and P99 ITL/TPOT panels (default: the results' "
                        "slo, else DualPace's 5000,1500); attainment stays the run's own")
    p.add_argument("--target", action="append", metavar="EXPR",
                   help="a target line replacing the panel's default, e.g. p99_ttft_ms<=2000, "
                        "slo_attainment>=0.9; a metric without a panel gets one")
    p.add_argument("--timeline-rate", type=float, metavar="REQ_PER_S",
                   help="rate of the token timeline (default: the first measured rate at which "
                        "some policy misses the P99 TTFT target)")
    p.add_argument("--seed", type=int, help="seed of the token timeline (default: the first)")
    p.add_argument("--approx-timeline", action="store_true",
                   help="do not re-simulate the timeline's point for exact token times")
    p.add_argument("--format", default="png,svg", help="comma-separated: png, svg, pdf "
                   "(default png,svg)")
    p.set_defaults(handler=_plot)
