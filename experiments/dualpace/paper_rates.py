"""Run the DualPace paper experiments (vllm and dualpace; neo once it is merged) and print
each policy's sustainable request rate per target beside the paper's numbers.

    python experiments/dualpace/paper_rates.py [--only fig09a] [--requests N] [--workers 2]
    python experiments/dualpace/paper_rates.py --fig1 [--rate 3.5]

Results go to results/dualpace-paper/<experiment>/ (a `simserve sweep` folder: finished points
are reused). The paper's rates are ratios (DualPace over vLLM / NEO), so those are printed.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))   # this checkout's simserve, not an installed one
TARGETS = ("mean_normalized_latency_s<=1", "p99_ttft_ms<=5000", "p99_itl_ms<=1500",
           "p99_tpot_ms<=1500")
# experiment file stem -> (vllm TP, {target: (paper DualPace/vLLM, paper DualPace/NEO)})
PAPER = {
    "fig09a-10a-14a-conv-llama8b-rtx4090": (1, {TARGETS[0]: (1.906, 1.432),
                                                 TARGETS[2]: (None, 1.505),
                                                 TARGETS[3]: (None, 1.61)}),
    "fig09b-10b-14b-conv-qwen14b-2xh20": (2, {TARGETS[0]: (1.115, 1.069),
                                               TARGETS[2]: (None, 1.152),
                                               TARGETS[3]: (None, 1.15)}),
    "fig09c-10c-14c-conv-qwen32b-4xh20": (4, {TARGETS[0]: (1.238, 1.181),
                                               TARGETS[2]: (None, 1.073),
                                               TARGETS[3]: (None, 1.03)}),
    "fig09d-13a-14d-code-llama8b-rtx4090": (1, {}),
    "fig09e-13b-14e-code-qwen14b-2xh20": (2, {}),
    "fig09f-13c-14f-code-qwen32b-4xh20": (4, {}),
}


def run_sweep(stem: str, tp: int, requests: int | None, workers: int) -> Path:
    out = ROOT / "results" / "dualpace-paper" / stem
    pol = "[{name: vllm%s}, {name: dualpace}]" % (f", tp: {tp}" if tp > 1 else "")
    cmd = [sys.executable, "-m", "simserve.cli", "sweep", str(HERE / f"{stem}.yaml"),
           "--out", str(out), "--workers", str(workers), "-q", "--set", f"policies={pol}"]
    if requests:
        cmd += ["--set", f"workload.num_requests={requests}"]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return out


def report(stem: str, out: Path) -> None:
    from simserve.experiment.capacity import grid_capacity, load_records, parse_target
    recs = load_records(out)
    caps = grid_capacity(recs, [parse_target(t) for t in TARGETS])
    paper = PAPER[stem][1]
    print(f"\n{stem}")
    for t in TARGETS:
        got = {c.group.get("policy"): c for c in caps if c.target.metric == parse_target(t).metric}
        v, d = got.get("vllm"), got.get("dualpace")
        ratio = (d.rate / v.rate if v and d and not v.censored and not d.censored else None)
        pv, pn = paper.get(t, (None, None))
        print(f"  {t:30s} vllm {v.text if v else '-':>7s}  dualpace {d.text if d else '-':>7s}"
              f"  dualpace/vllm {'%.2f' % ratio if ratio else '?':>5s}"
              f"  paper: /vllm {pv or '-'}  /neo {pn or '-'}")


def fig1(rate: float, requests: int | None) -> None:
    """Fig. 1 top: cumulative generated and CPU-decoded tokens over time at one rate, for
    vLLM, NEO and DualPace; prints a table and draws plots/fig1-progress.png."""
    import numpy as np

    from simserve.experiment.config import load_experiment
    from simserve.experiment.runner import make_workload
    from simserve.hardware.setup import resolve_hardware
    from simserve.progress import cpu_progress_stalls, token_progress
    from simserve.sim.run import simulate_point
    sets = ["policies=[{name: vllm}, {name: neo}, {name: dualpace}]", f"workload.rates=[{rate}]"]
    if requests:
        sets.append(f"workload.num_requests={requests}")
    cfg = load_experiment(HERE / "fig01-progress-llama8b-rtx4090.yaml", sets)
    hw = resolve_hardware(cfg.hardware)
    curves = {}
    for pol in cfg.policies:
        res = simulate_point(make_workload(cfg, rate, 0), cfg.model, hw, pol.name, pol.config)
        end = float(np.nanmax(res.records.token_times_s))
        curves[pol.name] = token_progress(res.records, np.linspace(0, end, 200))
        p = token_progress(res.records, np.linspace(0, end, 11))
        print(f"Fig. 1 ({pol.name}, {rate} req/s): time s / total tokens / CPU-decoded tokens")
        for t, a, c in zip(p["t_s"], p["tokens_total"], p["tokens_cpu"]):
            print(f"  {t:8.1f} {a:9d} {c:9d}")
        st = cpu_progress_stalls(res.records, 2.0)
        print(f"  CPU-token gaps > 2 s: {len(st)} (longest {st.max() if len(st) else 0:.2f} s)")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, c in curves.items():
        line, = ax.plot(c["t_s"], c["tokens_total"], label=f"{name}: all tokens")
        if c["tokens_cpu"].any():
            ax.plot(c["t_s"], c["tokens_cpu"], "--", color=line.get_color(),
                    label=f"{name}: CPU-decoded tokens")
    ax.set(xlabel="time (s)", ylabel="cumulative tokens",
           title=f"Llama-3.1-8B, RTX 4090 + 12 cores, Azure-Conversation, {rate} req/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = HERE / "plots"
    out.mkdir(exist_ok=True)
    fig.savefig(out / "fig1-progress.png", dpi=110)
    print(f"plot: {out / 'fig1-progress.png'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run experiments whose name contains this")
    ap.add_argument("--requests", type=int, help="fewer requests (quick look)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fig1", action="store_true")
    ap.add_argument("--rate", type=float, default=3.5)
    a = ap.parse_args()
    if a.fig1:
        fig1(a.rate, a.requests)
        return 0
    for stem, (tp, _) in PAPER.items():
        if a.only and a.only not in stem:
            continue
        report(stem, run_sweep(stem, tp, a.requests, a.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
