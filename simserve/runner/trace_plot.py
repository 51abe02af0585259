"""`simserve plot --trace-events FILE` and `simserve plot POINT_FOLDER`: the Gantt timeline
of one simulated point (`simserve.plot_trace`), from a trace file, or re-simulated with a trace
from a sweep point's resolved `config.yaml` and `record.json`."""
from __future__ import annotations

import json
from pathlib import Path

from simserve.errors import SimserveError


def is_point_folder(folder: Path) -> bool:
    return (folder / "record.json").exists() and (folder / "config.yaml").exists() \
        and not (folder / "summary.json").exists()


def trace_point(folder: Path, out: Path) -> Path:
    """Re-simulate the point stored in `folder` with a trace written to `out`."""
    from simserve.hardware.setup import resolve_hardware
    from simserve.run import simulate_point
    from simserve.runner.config import load_experiment
    from simserve.runner.point import make_workload
    try:
        rec = json.loads((folder / "record.json").read_text())
        rec = rec[0] if isinstance(rec, list) else rec
        label, rate, seed = rec["policy"], float(rec["request_rate"]), int(rec.get("seed", 0))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise SimserveError(f"{folder / 'record.json'}: not a point record ({exc})") from None
    cfg = load_experiment(folder / "config.yaml")
    pol = next((p for p in cfg.policies if p.label == label), None)
    if pol is None:
        raise SimserveError(f"{folder / 'config.yaml'}: no policy labelled {label!r}")
    simulate_point(make_workload(cfg, rate, seed), cfg.model, resolve_hardware(cfg.hardware),
                   pol.name, pol.config, seed=seed, trace_events=out)
    return out


def parse_window(text: str | None) -> tuple[float, float] | None:
    if not text:
        return None
    try:
        a, b = (float(x) for x in text.split(","))
    except ValueError:
        raise SimserveError(f"--window {text!r}: expected T0,T1 in seconds, e.g. 10,12") from None
    if not b > a:
        raise SimserveError(f"--window {text!r}: T1 must be after T0")
    return a, b


def draw(trace: Path, out: Path, formats, window=None, title: str | None = None) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simserve.plot_trace import load_trace, trace_gantt, tracks
    try:
        doc = load_trace(trace)
    except (OSError, ValueError) as exc:
        raise SimserveError(f"--trace-events {trace}: {exc}") from None
    n = len(tracks(doc)[0])
    if not n:
        raise SimserveError(f"{trace}: no complete ('X') events to draw")
    fig, ax = plt.subplots(figsize=(12, 0.42 * max(n, 2) + 1.6), layout="constrained")
    trace_gantt(doc, ax, window=window, title=title or f"Timeline of {trace.name}")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        p = out / f"trace.{fmt}"
        fig.savefig(p, dpi=130)
        paths.append(p)
    plt.close(fig)
    return paths
