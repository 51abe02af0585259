"""`simserve calibrate run | fit`: measure kernels (needs PyTorch) and fit profiles (does not)."""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from simserve.errors import SimserveError

# user-facing parts -> measurement parts of run_all
PARTS = {"gpu": ["dense", "prefill", "decode", "launch"], "cpu": ["cpu"], "links": ["links"]}


def _run(args: argparse.Namespace) -> int:
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in (*PARTS, "collectives")]
    if unknown:
        raise SimserveError(f"--parts: unknown part(s) {unknown}; known: gpu, cpu, links, collectives")
    if importlib.util.find_spec("torch") is None:
        raise SimserveError("simserve calibrate run needs PyTorch (pip install torch); the "
                            "simulator itself does not")
    if "collectives" in parts:
        print("collectives run one process per GPU: torchrun --nproc_per_node=N "
              "-m simserve.calibrate.collectives --out DIR")
        parts.remove("collectives")
    if not parts:
        return 0
    from simserve.calibrate import run_all
    inner = [x for p in parts for x in PARTS[p]]
    argv = ["--out", args.out, "--parts", ",".join(inner), "--total-s", str(args.total_s),
            "--cpu-threads", args.cpu_threads]
    if args.smoke:
        argv.append("--smoke")
    return run_all.main(argv)


def _fit(args: argparse.Namespace) -> int:
    from simserve.calibrate.build import build_cpu, build_gpu, build_link, build_nvlink
    from simserve.hardware.derive import write_profile
    raw = Path(args.raw)
    if not raw.is_dir():
        raise SimserveError(f"--raw {raw}: no such folder")
    from simserve.paths import profile_write_dir
    out = Path(args.out) if args.out else profile_write_dir()
    jobs = [(n, f) for n, f in ((args.gpu, build_gpu), (args.cpu, build_cpu),
                                (args.link, build_link), (args.nvlink, build_nvlink)) if n]
    if not jobs:
        raise SimserveError("name at least one of --gpu, --cpu, --link, --nvlink")
    for name, build in jobs:
        print(write_profile(build(raw, name), out / f"{name}.yaml"))
    return 0


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="measure kernels on this machine and fit profiles")
    s = p.add_subparsers(dest="calibrate_cmd", metavar="ACTION")
    s.required = True
    r = s.add_parser("run", help="measure (PyTorch, a GPU for the gpu/links parts)")
    r.add_argument("--parts", default="gpu,cpu,links", help="gpu, cpu, links, collectives")
    r.add_argument("--out", required=True, help="folder for the raw CSVs and meta.json")
    r.add_argument("--total-s", type=float, default=540.0, help="time budget for all parts")
    r.add_argument("--cpu-threads", default="16,12")
    r.add_argument("--smoke", action="store_true", help="tiny grids, to check the set-up")
    r.set_defaults(handler=_run)
    f = s.add_parser("fit", help="fit raw points into measured profiles (no PyTorch needed)")
    f.add_argument("--raw", required=True, help="raw folder, e.g. hwprofiles/raw/h200-sxm")
    f.add_argument("--gpu", help="GPU profile name to write, e.g. h200-sxm")
    f.add_argument("--cpu", help="CPU profile name to write, e.g. xeon-emr")
    f.add_argument("--link", help="host link profile name to write, e.g. pcie5-x16")
    f.add_argument("--nvlink", help="GPU-GPU link profile to write from collectives.csv, e.g. "
                   "nvlink4 (raw folder of a multi-GPU run)")
    f.add_argument("--out", help="folder for the profiles (default: simserve/data/hwprofiles "
                   "in a source checkout, else ~/.config/simserve/hwprofiles)")
    f.set_defaults(handler=_fit)
