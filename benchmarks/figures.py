"""Every figure of the repository, regenerated from what is committed: the validation
folders' measured and scored CSVs, and the paper experiments' YAML files (swept first; a
finished sweep point is reused, so a rerun only draws). Figures are not committed.

    python benchmarks/figures.py [--out DIR] [--only TEXT ...] [--no-run] [--results DIR]
                                 [--workers N] [--set KEY=VALUE ...] [--list]

`--out` (default: the repository) is mirrored: `validation/<run>/iterations.png`,
`experiments/conflux/plots/<figure>/{attainment,latency,timeline}.png`,
`experiments/dualpace/plots/*.png`, the paths the READMEs name. `--only` keeps the jobs
whose name contains the text (`--list` names them); `--no-run` draws only what has results
already; `--set` overrides every swept experiment (e.g. fewer requests for a quick look).
Sweep results go to `--results` (default `results/`, as `simserve sweep` and
`benchmarks/dualpace_paper.py` name them).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this checkout's simserve, not an installed one

from simserve.errors import SimserveError  # noqa: E402

# ConfluxServe: plot folder -> (experiment YAML, extra --set overrides)
CONFLUX = {
    "llama8b": ("fig12-llama8b.yaml", []),
    "qwen14b": ("fig12-qwen14b.yaml", []),
    "qwen32b": ("fig12-qwen32b.yaml", []),
    "llama8b-h200": ("fig12-llama8b.yaml", ["hardware.gpu=h200-sxm"]),
    "qwen14b-h200": ("fig12-qwen14b.yaml", ["hardware.gpu=h200-sxm"]),
    "qwen32b-h200": ("fig12-qwen32b.yaml", ["hardware.gpu=h200-sxm"]),
    "fig16-qwen14b-mooncake-synthetic": ("fig16-qwen14b-mooncake-synthetic.yaml", []),
    "fig16-qwen14b-qwen-a": ("fig16-qwen14b-qwen-a.yaml", []),
    "fig17-qwen14b-tbt150": ("fig17-qwen14b-tbt150.yaml", []),
    "fig17-qwen14b-tbt50": ("fig17-qwen14b-tbt50.yaml", []),
}


@dataclass(frozen=True)
class Options:
    out: Path
    results: Path
    run: bool
    workers: int
    sets: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    name: str
    draw: Callable[[Options], list[Path]]


def _validation_jobs() -> list[Job]:
    jobs = []
    for d in sorted(p for p in (ROOT / "validation").iterdir() if p.is_dir()):
        if (d / "sp_scored.csv").exists() and (d / "sp_summary.json").exists():
            jobs.append(Job(f"validation/{d.name}", lambda o, d=d: _sp_figure(d, o)))
        elif any((d / f).exists() for f in ("gpu_scored.csv", "cpu_scored.csv",
                                              "replay_sim_requests.csv")):
            jobs.append(Job(f"validation/{d.name}", lambda o, d=d: _iteration_figures(d, o)))
    return jobs


def _iteration_figures(d: Path, o: Options) -> list[Path]:
    from simserve.realcheck.plots import plot_folder
    return [Path(p) for p in plot_folder(str(d), fig_dir=str(o.out / "validation" / d.name))]


def _sp_figure(d: Path, o: Options) -> list[Path]:
    from simserve.realcheck import sp_score
    res = json.loads((d / "sp_summary.json").read_text())
    return [Path(sp_score.plot(str(d), res, fig_dir=str(o.out / "validation" / d.name)))]


def _conflux(name: str, o: Options) -> list[Path]:
    from simserve.cli import main
    yaml, extra = CONFLUX[name]
    stem = Path(yaml).stem
    suffix = "-h200" if "hardware.gpu=h200-sxm" in extra else ""
    res = o.results / f"conflux-{stem}{suffix}-sweep"
    sets = [x for s in [*extra, *o.sets] for x in ("--set", s)]
    if o.run:
        rc = main(["sweep", str(ROOT / "experiments" / "conflux" / yaml), "--out", str(res),
                   "--workers", str(o.workers), "-q", *sets])
        if rc:
            raise SimserveError(f"conflux/{name}: simserve sweep exited {rc}")
    if not (res / "summary.json").exists():
        print(f"conflux/{name}: no results in {res} (run without --no-run)")
        return []
    out = o.out / "experiments" / "conflux" / "plots" / name
    with contextlib.redirect_stdout(io.StringIO()):   # it prints the paths main() prints
        rc = main(["plot", str(res), "--out", str(out), "--format", "png", "--approx-timeline"])
    if rc:
        raise SimserveError(f"conflux/{name}: simserve plot exited {rc}")
    return sorted(out.glob("*.png"))


def _dualpace_module(o: Options):
    import importlib.util
    spec = importlib.util.spec_from_file_location("dualpace_paper",
                                                  ROOT / "benchmarks" / "dualpace_paper.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.PLOTS = o.out / "experiments" / "dualpace" / "plots"
    mod.RESULTS = o.results / "dualpace-paper"
    return mod


def _dualpace_rates(workload: str, o: Options) -> list[Path]:
    """Fig. 9 / 10 / 13 / 14 (the Azure trace, or the paper's Fig. 8 means)."""
    dp = _dualpace_module(o)
    if o.run:
        for stem in dp.PAPER:
            _sweep_dualpace(dp, stem, workload, o)
    if not any((dp.out_dir(s, workload) / "summary.json").exists() for s in dp.PAPER):
        print(f"dualpace ({workload}): no results in {dp.RESULTS}")
        return []
    return dp.paper_figures(workload)


def _sweep_dualpace(dp, stem: str, workload: str, o: Options) -> None:
    if not o.sets:
        dp.run_sweep(stem, workload, o.workers)
        return
    from simserve.cli import main
    sets = [x for s in o.sets for x in ("--set", s)]
    main(["sweep", str(dp.HERE / f"{stem}.yaml"), "--out", str(dp.out_dir(stem, workload)),
          "--workers", str(o.workers), "-q", *sets])


def _dualpace_fig11(o: Options) -> list[Path]:
    from simserve.cli import main
    dp = _dualpace_module(o)
    if o.run:
        for stem in dp.FIG11:
            main(["sweep", str(dp.HERE / f"{stem}.yaml"), "--out", str(dp.RESULTS / stem),
                  "--workers", str(o.workers), "-q", *[x for s in o.sets for x in ("--set", s)]])
    if not any((dp.RESULTS / s / "summary.json").exists() for s in dp.FIG11):
        print(f"dualpace/fig11: no results in {dp.RESULTS}")
        return []
    return [dp.fig11_plot()]


def _dualpace_h200(o: Options) -> list[Path]:
    dp = _dualpace_module(o)
    if o.run:
        _sweep_dualpace(dp, dp.H200, "trace", o)
    out = dp.RESULTS / dp.H200
    if not (out / "summary.json").exists():
        print(f"dualpace/h200: no results in {out}")
        return []
    return [dp.four_panels(out, "Llama-3.1-8B, H200 + 16 cores xeon-emr (measured profiles), "
                           "Azure-Conv, first 2,000 requests", dp.PLOTS / "h200.png")]


def _dualpace_fig1(o: Options) -> list[Path]:
    dp = _dualpace_module(o)
    if not o.run:
        print("dualpace/fig1: simulates its point; skipped under --no-run")
        return []
    dp.fig1(3.5, None)
    return [dp.PLOTS / "fig1-progress.png"]


def jobs() -> list[Job]:
    out = _validation_jobs()
    out += [Job(f"conflux/{n}", lambda o, n=n: _conflux(n, o)) for n in CONFLUX]
    out += [Job("dualpace/fig09-10-13-14", lambda o: _dualpace_rates("trace", o)),
            Job("dualpace/fig09-10-13-14-paper-means",
                lambda o: _dualpace_rates("paper-means", o)),
            Job("dualpace/fig11-sensitivity", _dualpace_fig11),
            Job("dualpace/h200", _dualpace_h200),
            Job("dualpace/fig1-progress", _dualpace_fig1)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT), help="root the figure paths are mirrored under "
                    "(default: the repository)")
    ap.add_argument("--only", action="append", metavar="TEXT",
                    help="jobs whose name contains TEXT (repeatable)")
    ap.add_argument("--results", default=str(ROOT / "results"), help="sweep results folder")
    ap.add_argument("--no-run", action="store_true", help="draw from existing results only")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override for every swept experiment")
    ap.add_argument("--list", action="store_true", help="name the jobs and exit")
    a = ap.parse_args(argv)
    todo = [j for j in jobs() if not a.only or any(t in j.name for t in a.only)]
    if a.list:
        print("\n".join(j.name for j in todo))
        return 0
    if not todo:
        print(f"figures.py: --only {' '.join(a.only)}: no such job (see --list)", file=sys.stderr)
        return 2
    o = Options(Path(a.out), Path(a.results), not a.no_run, a.workers, tuple(a.set))
    import matplotlib
    matplotlib.use("Agg")
    try:
        for j in todo:
            for p in j.draw(o):
                print(p, flush=True)
    except SimserveError as exc:
        print(f"figures.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
