"""Device plan: NCCL all-reduce / all-to-all / all-gather / reduce-scatter at 4 and 8 ranks, one
call on an 8-GPU host (the 2-rank measurement behind `nvlink4` extended; NVLink multicast off).

    python benchmarks/nccl_sweep.py --out $OUT [--total-s 560]

Runs `simserve.calibrate.collectives` twice, on GPUs 0-3 then 0-7, each into its own folder
($OUT/ranks4, $OUT/ranks8: collectives.csv, meta.json with NCCL/driver versions, topology
and world size; run.log), splitting the time 45 / 55 %. Afterwards, on this machine:

    simserve calibrate fit --raw RAW/ranks4 --nvlink nvlink4-r4 --out /tmp/r4   (likewise r8)

fits latency + bus bandwidth at that rank count (build_nvlink reads the world size from
meta.json), to compare with the band `simserve.hardware.collective_band.BAND` assumed from
published nccl-tests figures; the measured tables then replace the band for those ranks.
NVLink SHARP (NVLS) stays off, as the collectives module forces: vLLM on an NVSwitch host
may use it, which is the band's fast edge.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--total-s", type=float, default=560.0)
    ap.add_argument("--ranks", default="4,8")
    a = ap.parse_args(argv)
    t_end = time.monotonic() + a.total_s
    ranks = [int(r) for r in a.ranks.split(",")]
    shares = {4: 0.45, 8: 0.55}
    rc = 0
    for i, n in enumerate(ranks):
        left = t_end - time.monotonic()
        budget = left if i == len(ranks) - 1 else left * shares.get(n, 1 / len(ranks))
        out = Path(a.out) / f"ranks{n}"
        out.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, range(n))),
                   MASTER_PORT=str(29517 + n), PYTHONPATH=str(ROOT))
        cmd = [sys.executable, "-m", "simserve.calibrate.collectives", "--out", str(out),
               "--nproc", str(n), "--total-s", str(int(budget - 15)), "--coarse"]
        with open(out / "run.log", "w") as log:
            r = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                               timeout=budget + 30)
        print(f"ranks {n}: exit {r.returncode}, {out}")
        rc = rc or r.returncode
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
