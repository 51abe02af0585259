"""`simserve profiles list | show NAME`."""
from __future__ import annotations

import argparse

from simserve.hardware.profile import available_profiles, load_profile


def _list(args: argparse.Namespace) -> int:
    found = available_profiles()
    if not found:  # the shipped folder is always searched: an install without its data
        from simserve.errors import SimserveError
        from simserve.hardware.profile import profile_dirs
        raise SimserveError("no hardware profiles found in "
                            f"{', '.join(map(str, profile_dirs()))} (is simserve installed "
                            "with its package data?)")
    rows = [("name", "kind", "provenance", "models", "device")]
    for name, path in found.items():
        p = load_profile(path)
        rows.append((name, p.kind, p.provenance_type, str(len(p.models())),
                     str(p.spec.get("vendor_name", ""))))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(x.ljust(n) for x, n in zip(r, w)).rstrip())
    return 0


def _show(args: argparse.Namespace) -> int:
    p = load_profile(args.name)
    print(f"{p.name} ({p.kind}, {p.provenance_type}) from {p.path}")
    for k, v in p.provenance.items():
        print(f"  provenance.{k}: {v}")
    for k, v in p.spec.items():
        print(f"  spec.{k}: {v}")
    for k, v in (p.overheads or p.link).items():
        print(f"  {'overheads' if p.overheads else 'link'}.{k}: {v}")
    if p.models():
        print(f"  op tables for: {', '.join(p.models())}")
    return 0


def anchor_report(p) -> tuple[str, bool]:
    """The profile's residual against each published anchor in its provenance; False when a
    derived CPU profile names none."""
    from simserve.hardware import anchors as A
    rows = A.residuals(p)
    if not rows:
        if A.needs_anchor(p):
            return (f"{p.path}: provenance.anchors: derived CPU profile {p.name!r} names no "
                    "published measurement to anchor it (docs/hwprofiles.md, Anchors)"), False
        return "", True
    out = [f"{p.name}: against published measurements (residual = profile's prediction / "
           "published value - 1)"]
    for r in rows:
        band = "" if r["within"] is None else ("  inside the published range" if r["within"]
                                               else "  OUTSIDE the published range")
        out.append(f"  {r['id']:<16} {'fitted' if r['fit'] else 'check ':<6} {r['quantity']}"
                   f" at {r['where']}: published {r['value']:.4g}, predicted {r['predicted']:.4g}"
                   f" {r['unit']}, residual {100 * r['residual']:+.1f} %{band} ({r['date']})")
    return "\n".join(out), True


def _check(args: argparse.Namespace) -> int:
    from simserve.calibrate.check import run_check
    names = [args.name] if args.name else list(available_profiles())
    ok_all = True
    for name in names:
        p = load_profile(name)
        text, ok = anchor_report(p)
        if p.provenance_type == "measured" and args.name:
            fit_text, fit_ok = run_check(name)
            text = fit_text + ("\n" + text if text else "")
            ok = ok and (fit_ok or not args.strict)
        elif not text and args.name:
            text = f"{name}: {p.provenance_type} {p.kind} profile: nothing measured to hold out, no anchors"
        if text:
            print(text)
        ok_all = ok_all and ok
    return 0 if ok_all else 1


def _plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simserve.calibrate.check import plot_profile
    for path in plot_profile(args.name, Path(args.out), args.model, args.tp):
        print(path)
    return 0


def _controls(args: argparse.Namespace) -> int:
    import numpy as np

    from simserve.policies.dualpace import controls as C
    from simserve.models import get_model
    m = get_model(args.model)
    gpu = load_profile(args.name, expect_kind="gpu")
    print(f"{gpu.name} ({gpu.provenance_type}), {m.name}, TP{args.tp}")
    limit = C.gpu_token_limit_from(gpu, m, args.tp)
    print(f"  GPU batched-token limit (isotonic plateau, K=5, delta=1%): {limit}")
    if not args.cpu:
        return 0
    cpu = load_profile(args.cpu, expect_kind="cpu")
    cores = args.cores or (cpu.cpu_core_counts(m.name) or [None])[-1]
    cops = cpu.cpu_ops(m.name, cores)
    print(f"{cpu.name} ({cpu.provenance_type}), {cores} cores")
    print(f"  CPU decode batch limit (throughput maximum over contexts "
          f"{list(C.CPU_CONTEXTS)}): {C.cpu_batch_limit_from(cops)}")
    pcie = load_profile(args.pcie or gpu.spec.get("pcie"), expect_kind="link")
    batches = np.array(C.CPU_BATCHES)
    wait = args.assist_wait_us
    if wait is None:
        wait = C.stage_wait_us(gpu, m, args.tp, limit)
    rt = C.route_times_from(gpu.ops(m.name, 1), cops, pcie, m, batches, wait_us=wait,
                            host_us=C.assist_host_us(gpu.name))
    scores = C.route_scores(rt, m.num_layers)
    p, f = C.assist_thresholds(batches, scores, m.num_layers, args.eps)
    p0, f0 = C.assist_thresholds(batches, scores, m.num_layers, 0.0)
    print(f"  Dense Assist thresholds over {pcie.name}, stage-boundary wait {wait:.0f} us, "
          f"host launch + finalise {C.assist_host_us(gpu.name):.0f} us (Fig. 12, assumed): "
          f"(P, F) = ({p}, {f}) at eps={args.eps:g}; exact minimum ({p0}, {f0})")
    print("  route scores S_r(b) in ms (full / split / fused):")
    for i, b in enumerate(batches):
        print(f"    b={b:4d}: " + " / ".join(f"{scores[r, i]:8.2f}" for r in range(3)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("profiles", help="hardware profiles: list, show, check, plot, controls")
    s = p.add_subparsers(dest="profiles_cmd", metavar="ACTION")
    s.required = True
    a = s.add_parser("list", help="shipped profiles and their provenance")
    a.set_defaults(handler=_list)
    b = s.add_parser("show", help="one profile's provenance, datasheet numbers and overheads")
    b.add_argument("name")
    b.set_defaults(handler=_show)
    c = s.add_parser("check", help="held-out error of a measured profile's fits, per op, and "
                     "every profile's residual against its published anchors")
    c.add_argument("name", nargs="?", help="one profile (default: every anchored profile)")
    c.add_argument("--strict", action="store_true", help="exit 1 when an op misses its bar")
    c.set_defaults(handler=_check)
    pl = s.add_parser("plot", help="measured points and fitted tables of a measured profile")
    pl.add_argument("name")
    pl.add_argument("--model", help="model whose tables to draw (GPU profiles)")
    pl.add_argument("--tp", type=int, default=1)
    pl.add_argument("--out", default="results/profiles", help="folder for PNG and SVG files")
    pl.set_defaults(handler=_plot)
    k = s.add_parser("controls", help="DualPace's profile-guided controls for a model")
    k.add_argument("name", help="GPU profile")
    k.add_argument("--model", required=True)
    k.add_argument("--tp", type=int, default=1)
    k.add_argument("--cpu", help="CPU profile (for the CPU batch limit and Dense Assist)")
    k.add_argument("--cores", type=int, help="CPU cores (default: the largest in the profile)")
    k.add_argument("--pcie", help="host link profile (default: the GPU's)")
    k.add_argument("--eps", type=float, default=0.0025, help="Alg. 1 regret tolerance")
    k.add_argument("--assist-wait-us", type=float, default=None,
                   help="mean wait of an assist for the GPU's next stage boundary (App. B q_x); "
                        "default: half a layer of a batch at the GPU batched-token limit")
    k.set_defaults(handler=_controls)
