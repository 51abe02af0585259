"""Device plan: NCCL all-reduce / all-to-all / all-gather / reduce-scatter at 4 and 8 ranks, one
call on an 8-GPU host (the 2-rank measurement behind `nvlink4` extended; NVLink multicast off).

    python benchmarks/nccl_sweep.py --out $OUT [--total-s 560]
    python benchmarks/nccl_sweep.py --dry-run       # here: checks the plan and the fit

Runs `simserve.calibrate.collectives` twice, on GPUs 0-3 then 0-7, each into its own folder
($OUT/ranks4, $OUT/ranks8: collectives.csv, meta.json with NCCL/driver versions, topology
and world size; run.log), splitting the time 45 / 55 %. Afterwards, on this machine:

    python -m simserve calibrate fit --raw RAW/ranks4 --nvlink nvlink4 --out /tmp/r4   (likewise 8)

fits latency + bus bandwidth at that rank count into /tmp/r4/nvlink4.yaml (build_nvlink reads
the world size from meta.json; tables `allreduce_ranks4`, ...), to compare with the band `simserve.hardware.collective_band.BAND` assumed from
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


def _budgets(total_s: float, ranks: list[int]) -> list[float]:
    """Each rank count's share of the call, as main() splits it (no time spent in between)."""
    left, out = total_s, []
    for i, n in enumerate(ranks):
        b = left if i == len(ranks) - 1 else left * {4: 0.45, 8: 0.55}.get(n, 1 / len(ranks))
        out.append(b)
        left -= b
    return out


def dry_run(total_s: float, ranks: list[int]) -> int:
    """Here, no GPU: the budget split, the child's arguments, and the fit on a synthetic
    folder per rank count (the 2-rank measurement's rows relabelled) in the returned layout."""
    import csv
    import json
    import shutil
    import tempfile
    sys.path.insert(0, str(ROOT))
    from simserve import device_check as D
    probs = []
    src = (ROOT / "simserve" / "calibrate" / "collectives.py").read_text()
    probs += [f"collectives.py has no {flag}" for flag in ("--nproc", "--total-s", "--coarse")
              if f'"{flag}"' not in src]
    for n, b in zip(ranks, _budgets(total_s, ranks)):
        if b - 15 < 120:
            probs.append(f"ranks {n}: {b - 15:.0f} s of measuring, under 120")
    if total_s + 30 > 600:
        probs.append(f"--total-s {total_s:.0f} + 30 s of start exceeds a call's 600 s")
    raw2 = ROOT / "hwprofiles" / "raw" / "h200-sxm-x2"
    with tempfile.TemporaryDirectory() as tmp:
        raw, out = Path(tmp) / "raw", Path(tmp) / "OUT"
        for n in ranks:
            d = raw / f"ranks{n}"
            d.mkdir(parents=True)
            meta = json.loads((raw2 / "meta.json").read_text())
            meta["world_size"] = n
            (d / "meta.json").write_text(json.dumps(meta))
            with open(raw2 / "collectives.csv") as f, open(d / "collectives.csv", "w") as g:
                r = csv.DictReader(f)
                w = csv.DictWriter(g, fieldnames=r.fieldnames)
                w.writeheader()
                for row in r:
                    row["tp"] = str(n)
                    w.writerow(row)
            (d / "run.log").write_text("synthetic\n")
        probs += D.return_problems(os.path.dirname(D.pack(str(raw), str(out), "nccl")))
        back = Path(D.unpack(str(out / "nccl.tar.xz"), str(Path(tmp) / "back")))
        from simserve.cli import main as cli
        for n in ranks:
            prof = Path(tmp) / f"r{n}"
            try:
                cli(["calibrate", "fit", "--raw", str(back / f"ranks{n}"), "--nvlink", "nvlink4",
                     "--out", str(prof)])
                text = (prof / "nvlink4.yaml").read_text()
                if f"measured_ranks: {n}" not in text or f"allreduce_ranks{n}" not in text:
                    probs.append(f"ranks {n}: the fitted profile does not name {n} ranks")
            except (Exception, SystemExit) as exc:  # noqa: BLE001  (reported as a problem)
                probs.append(f"ranks {n}: calibrate fit failed: {exc}")
        shutil.rmtree(back)
    return D.report("nccl_sweep", probs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--total-s", type=float, default=560.0)
    ap.add_argument("--ranks", default="4,8")
    ap.add_argument("--dry-run", action="store_true", help="check the plan here, no GPU")
    a = ap.parse_args(argv)
    if a.dry_run:
        return dry_run(a.total_s, [int(r) for r in a.ranks.split(",")])
    if not a.out:
        ap.error("--out is required (or --dry-run)")
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
