"""`simserve validate iterations | replay | fit | report | sp | sp-report | sp-fit`: the real executor against the cost
model. `iterations` and `replay` measure (PyTorch with CUDA, on the GPU machine); `fit` and
`report` re-score stored measurements anywhere."""
from __future__ import annotations

import importlib.util
import math
import os
from contextlib import contextmanager
from pathlib import Path

from simserve.errors import SimserveError


def _need_torch(what: str) -> None:
    if importlib.util.find_spec("torch") is None:
        raise SimserveError(f"simserve validate {what} times real forward passes and needs "
                            "PyTorch with CUDA (the GPU machine); `simserve validate report DIR` "
                            "re-scores stored measurements without it")


def _fresh_out(out: str) -> None:
    if os.path.exists(os.path.join(out, "gpu_iterations.csv")) or os.path.exists(
            os.path.join(out, "cpu_iterations.csv")):
        raise SimserveError(f"--out {out}: already holds measurements; choose a new folder")


def _iterations(a) -> int:
    _need_torch("iterations")
    _fresh_out(a.out)
    from simserve.realcheck import device_run
    parts = ["gpu"] + (["cpu"] if a.cpu_n else [])
    device_run.main(["--out", a.out, "--parts", ",".join(parts), "--model", a.model,
                     "--profile", a.profile, "--gpu-n", str(a.n), "--cpu-n", str(a.cpu_n),
                     "--cpu-threads", str(a.threads), "--cpu-layers", str(a.layers),
                     "--seed", str(a.seed), "--budget-s", f"gpu={a.budget_s},cpu={a.budget_s}"])
    return _print(a.out, a.profile, a.cpu_profile, a.model, out_dir=a.out)


def _replay(a) -> int:
    if a.policy != "vllm":
        raise SimserveError(f"--policy {a.policy}: the replay drives the vllm scheduler only")
    if a.sim_only:
        from simserve.hardware.setup import HardwareConfig
        from simserve.realcheck.replay import run_pair
        from simserve.realcheck.store import save_replay
        from simserve.workload.build import build_workload
        os.makedirs(a.out, exist_ok=True)
        w = build_workload(a.trace, num_requests=a.n, arrival="scale", rate=a.rate, seed=0)
        save_replay(a.out, run_pair(w, a.model, HardwareConfig(gpu=a.profile)),
                    {"trace": a.trace, "n": a.n, "rate": a.rate, "profile": a.profile})
        print(f"simulated run written to {a.out}")
        return 0
    _need_torch("replay")
    from simserve.realcheck import device_run
    device_run.main(["--out", a.out, "--parts", "replay", "--model", a.model, "--profile",
                     a.profile, "--replay-trace", a.trace, "--replay-n", str(a.n),
                     "--replay-rate", str(a.rate)])
    return _print(a.out, a.profile, a.cpu_profile, a.model, out_dir=a.out)


def _fit(a) -> int:
    from simserve.realcheck import fit as F
    want = "cpu_iterations.csv" if a.cpu else "gpu_iterations.csv"
    for d in a.points:
        if not os.path.exists(os.path.join(d, want)):
            raise SimserveError(f"{d}: no {want} (a folder written by `simserve validate "
                                "iterations`)")
    if not os.path.isdir(a.raw):
        raise SimserveError(f"--raw {a.raw}: no such folder (the profile's raw points)")
    if a.cpu:
        r = F.fit_cpu([os.path.join(d, "cpu_iterations.csv") for d in a.points], a.profile,
                      a.model)
        name = f"in_situ_cpu-{a.model}.json" if a.per_model else "in_situ_cpu.json"
    else:
        if len(a.points) != 1:
            raise SimserveError("GPU in-situ fit takes one measurement folder")
        r = F.fit(os.path.join(a.points[0], "gpu_iterations.csv"), a.profile, a.model)
        name = "in_situ.json"
    path = F.write(r, a.raw, name)
    print(f"{path}: factor {r['factor']} at {r['tokens']}; MAPE {r['mape_without_pct']}% "
          f"without, {r['mape_out_of_fold_pct']}% held out; `simserve calibrate fit --raw "
          f"{a.raw} ...` puts it in the profile")
    return 0


@contextmanager
def _report_out(a):
    """Where a re-scoring writes: nowhere by default (the measurement folder may be committed
    data, and a report printed is all most runs need), `--out NEW` (a new folder, written
    whole or not at all), or the measurement folder itself with `--write`."""
    if a.write and a.out:
        raise SimserveError("--write and --out: give one (--write rewrites DIR's scored files)")
    if a.write:
        yield a.dir
        return
    if not a.out:
        yield None
        return
    out = Path(a.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SimserveError(f"--out {out}: exists and is not an empty folder; choose a new one")
    from simserve.runner.storage import atomic_folder
    with atomic_folder(out.absolute()) as tmp:
        yield str(tmp)
    print(f"scored files written to {out}/")


def _print(d: str, profile: str, cpu_profile: str, model: str, tp: int = 1,
           link: str = "nvlink4", out_dir: str | None = None) -> int:
    from simserve.realcheck.plots import plot_folder
    from simserve.realcheck.report import report
    r = report(d, profile, cpu_profile, model, tp, link, out_dir=out_dir)
    if out_dir:
        plot_folder(d, out_dir)
    print(f"{d}: {model}, GPU profile {profile}, CPU profile {cpu_profile}")
    print(f"{'set':26s} {'n':>4s} {'MAPE%':>6s} {'P90%':>6s} {'max%':>6s} {'bias%':>6s}")
    for key, label in (("gpu_graph", "GPU (CUDA graphs)"), ("gpu_eager", "GPU (eager launches)"),
                       ("cpu", "CPU decode")):
        for g, s in (r.get(key) or {}).items():
            print(f"{label + ('' if g == 'all' else ' ' + g):26s} {s['n']:4d} {s['mape_pct']:6.2f} "
                  f"{s['p90_ape_pct']:6.2f} {s['max_ape_pct']:6.2f} {s['mean_signed_pct']:+6.2f}")
    for w in r.get("gpu_graph_worst", [])[:3]:
        print(f"  worst GPU: {w['batch']}: measured {w['graph_us']:.0f} us, predicted "
              f"{w['predicted_graph_us']:.0f} us ({w['ape_pct']:.1f}%)")
    if r.get("replay"):
        print(f"{'replay metric':20s} {'simulated':>10s} {'real':>10s} {'error%':>7s}")
        for x in r["replay"]:
            e = x["error_pct"]
            print(f"{x['metric']:20s} {x['simulated']:10.2f} {x['real_executor']:10.2f} "
                  f"{(e if math.isfinite(e) else float('nan')):+7.2f}")
    return 0


def _report(a) -> int:
    if not os.path.isdir(a.dir):
        raise SimserveError(f"{a.dir}: no such measurement folder")
    with _report_out(a) as out_dir:
        return _print(a.dir, a.profile, a.cpu_profile, a.model, a.tp, a.link, out_dir)


def _sp(a) -> int:
    _need_torch("sp")
    if os.path.exists(os.path.join(a.out, a.model, "sp_iterations.csv")):
        raise SimserveError(f"--out {a.out}: already holds SP measurements; choose a new folder")
    from simserve.realcheck import sp_run
    sp_run.main(["--out", a.out, "--models", a.model, "--n", str(a.n), "--nproc", str(a.ranks),
                 "--budget-s", str(a.budget_s)])
    d = os.path.join(a.out, a.model)
    return _sp_print(d, a, d)


def _sp_report(a) -> int:
    if not os.path.isdir(a.dir):
        raise SimserveError(f"{a.dir}: no such measurement folder")
    with _report_out(a) as out_dir:
        return _sp_print(a.dir, a, out_dir)


def _sp_print(d: str, a, out_dir: str | None = None) -> int:
    from simserve.realcheck.sp_score import plot, score
    r = score(d, a.model, a.profile, a.link, a.ranks, out_dir=out_dir)
    if out_dir:
        plot(out_dir, r)
    print(f"{d}: {a.model}, SP{a.ranks} over {a.link}, GPU profile {a.profile}; measured: "
          f"{r['measured']} ({r['n_graph']} graphs)")
    print(f"{'predictor':40s} {'n':>4s} {'MAPE%':>6s} {'P90%':>6s} {'max%':>6s} {'bias%':>6s}")
    for key, label in (("estimator_paper_ab", f"estimator, α=β={r['paper_contention']}"),
                       ("estimator_heldout_ab", "estimator, α, β from the other half"),
                       ("estimator_refit_heldout", "estimator refitted on the other half"),
                       ("cost_model_paper_ab", f"cost model, α=β={r['paper_contention']}"),
                       ("cost_model_heldout_ab", "cost model, α, β from the other half")):
        for g, s in r[key].items():
            print(f"{label + ('' if g == 'all' else ' ' + g):40s} {s['n']:4d} {s['mape_pct']:6.2f} "
                  f"{s['p90_ape_pct']:6.2f} {s['max_ape_pct']:6.2f} {s['mean_signed_pct']:+6.2f}")
    for who, c in r["contention_fit_all"].items():
        print(f"{who}: α = {c['alpha']}, β = {c['beta']} fitted on all (halves: "
              f"{r['fit_on_even'][who]}, {r['fit_on_odd'][who]})")
    print(f"overlapped / serial split region, median: {r['overlap_over_serial_median']:.3f}; "
          f"graph / queued: {r['graph_over_queued_median']:.3f}")
    return 0


def _sp_fit(a) -> int:
    from simserve.realcheck.sp_score import fit_pooled, write_raw
    r = fit_pooled(a.points, a.profile, a.link, a.ranks)
    print(f"cost model contention fitted on {r['n_folders']} folder(s): alpha {r['alpha']}, "
          f"beta {r['beta']}; MAPE {r['mape_pct']} (paper's 1.28: {r['paper_mape_pct']})")
    for n, h in r.get("leave_one_model_out", {}).items():
        print(f"  {n}: fitted on the others alpha {h['alpha']}, beta {h['beta']} -> {h['mape_pct']}%")
    if a.raw:
        print(f"{write_raw(r, a.raw)} written; `simserve calibrate fit` puts it in the profile")
    return 0


def _runs_root(root: str) -> None:
    if not os.path.isdir(root):
        raise SimserveError(f"--root {root}: no such folder of real-vLLM runs")


def _serve(a) -> int:
    """Measure real vLLM serving (on a GPU machine with the payload), or re-score stored runs."""
    if a.score:
        from simserve.realcheck import serve_score
        _runs_root(a.root)
        return serve_score.main(["--root", a.root, "--engine", a.engine])
    _need_torch("serve")
    if not a.out:
        raise SimserveError("simserve validate serve: --out DIR is required to measure "
                            "(or --score to re-score stored runs)")
    from simserve.realcheck import vllm_campaign
    return vllm_campaign.main(["--campaign", a.campaign, "--out", a.out,
                               "--budget-s", str(a.budget_s)])


def _engine(a) -> int:
    """Fit vLLM's host path (step overhead, front end, its kernels' factor) from stored probes."""
    from simserve.realcheck import host_fit
    _runs_root(a.root)
    return host_fit.main(["--root", a.root] + (["--frontend"] if a.frontend else []))


def _common_args(q) -> None:
    q.add_argument("--profile", default="h200-sxm", help="GPU profile to predict with")
    q.add_argument("--cpu-profile", default="xeon-emr")
    q.add_argument("--model", default="llama-3.1-8b")


def _output_args(q) -> None:
    """`--out NEW` / `--write` of the re-scoring commands (see `_report_out`)."""
    g = q.add_argument_group("output (default: print the scores, write nothing)")
    g.add_argument("--out", help="new folder for the scored CSVs, summary and plots")
    g.add_argument("--write", action="store_true",
                   help="rewrite DIR's own scored CSVs, summary and plots")


def _sp_common_args(q) -> None:
    _common_args(q)
    q.add_argument("--link", default="nvlink4", help="the GPUs' link profile")
    q.add_argument("--ranks", type=int, default=2, help="GPUs of the SP group")


def _add_single_gpu(vs) -> None:
    """`iterations`, `replay` and `fit`: one GPU (and the CPU) measured, the in-situ factor."""
    q = vs.add_parser("iterations", help="random held-out batches, measured and predicted")
    _common_args(q)
    q.add_argument("--n", type=int, default=300, help="GPU batches")
    q.add_argument("--cpu-n", type=int, default=0, help="CPU decode batches (0: none)")
    q.add_argument("--threads", type=int, default=16)
    q.add_argument("--layers", type=int, default=4, help="layers of the CPU executor")
    q.add_argument("--seed", type=int, default=1)
    q.add_argument("--budget-s", type=float, default=240)
    q.add_argument("--out", required=True)
    q.set_defaults(handler=_iterations)
    q = vs.add_parser("replay", help="one trace through the vllm scheduler, real vs simulated")
    _common_args(q)
    q.add_argument("--policy", default="vllm")
    q.add_argument("--trace", required=True)
    q.add_argument("--n", type=int, default=300)
    q.add_argument("--rate", type=float, default=16.0)
    q.add_argument("--sim-only", action="store_true", help="only the simulated run (no GPU)")
    q.add_argument("--out", required=True)
    q.set_defaults(handler=_replay)
    q = vs.add_parser("fit", help="fit the in-situ factor from stored measurements")
    _common_args(q)
    q.add_argument("points", nargs="+", help="measurement folder(s)")
    q.add_argument("--raw", required=True, help="the profile's raw folder (writes in_situ*.json)")
    q.add_argument("--cpu", action="store_true", help="CPU iterations (by decode batch)")
    q.add_argument("--per-model", action="store_true",
                   help="with --cpu: the model's own factor (in_situ_cpu-MODEL.json), used for "
                        "that model instead of the profile's")
    q.set_defaults(handler=_fit)


def _add_sp(vs) -> None:
    """`sp`, `sp-report` and `sp-fit`: sequence parallelism on R GPUs."""
    q = vs.add_parser("sp", help="Conflux Parallelism iterations on R GPUs, measured and predicted")
    _sp_common_args(q)
    q.add_argument("--n", type=int, default=150)
    q.add_argument("--budget-s", type=float, default=240)
    q.add_argument("--out", required=True)
    q.set_defaults(handler=_sp)
    q = vs.add_parser("sp-report", help="score a stored SP measurement folder")
    _sp_common_args(q)
    q.add_argument("dir")
    _output_args(q)
    q.set_defaults(handler=_sp_report)
    q = vs.add_parser("sp-fit", help="fit the SP cost model's contention factors α, β")
    _sp_common_args(q)
    q.add_argument("--raw", default=None, help="the profile's raw folder (writes sp_contention.json)")
    q.add_argument("points", nargs="+", help="SP measurement folders scored by sp-report")
    q.set_defaults(handler=_sp_fit)


def _add_vllm(vs) -> None:
    """`serve` and `engine`: real vLLM serving, measured or re-scored, and its host path fitted."""
    from simserve.realcheck.serve_score import ROOT as VLLM_ROOT
    q = vs.add_parser("serve", help="real vLLM serving (vllm serve + streaming client), "
                                    "measured, or re-scored with --score")
    q.add_argument("--campaign", default=os.path.join(VLLM_ROOT, "campaign.json"))
    q.add_argument("--out", default=None, help="where the device run packs its results")
    q.add_argument("--budget-s", type=float, default=540, help="seconds for this call")
    q.add_argument("--score", action="store_true", help="re-score stored runs (no GPU)")
    q.add_argument("--root", default=VLLM_ROOT, help="stored runs (with --score)")
    q.add_argument("--engine", default="vllm", help="vllm | ideal | generic (with --score)")
    q.set_defaults(handler=_serve)
    q = vs.add_parser("engine", help="fit vLLM's host path from stored engine probes")
    q.add_argument("--root", default=VLLM_ROOT)
    q.add_argument("--frontend", action="store_true", help="also search the front-end costs")
    q.set_defaults(handler=_engine)


def _add_report(vs) -> None:
    q = vs.add_parser("report", help="score a stored measurement folder")
    _common_args(q)
    q.add_argument("--tp", type=int, default=1, help="TP degree the GPU iterations ran at")
    q.add_argument("--link", default="nvlink4", help="link profile for TP all-reduces")
    q.add_argument("dir")
    _output_args(q)
    q.set_defaults(handler=_report)


def register(sub) -> None:
    p = sub.add_parser("validate", help="real executor vs cost model (iterations, replay)")
    vs = p.add_subparsers(dest="validate_command", metavar="WHAT")
    vs.required = True
    _add_single_gpu(vs)
    _add_sp(vs)
    _add_vllm(vs)
    _add_report(vs)
