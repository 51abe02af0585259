"""Why does AMX reach ~10 % of its nominal peak on the calibration VM? One device call.

    python -m simserve.calibrate.amx_probe --out $OUT [--total-s 540] [--smoke]

Runs on the host of the device machine (16 AMX cores) in one call of at most 10 minutes and
writes under --out: `amx_probe.csv` (one row per timed point), `onednn_verbose/*.txt` (the
oneDNN kernel each variant dispatched), `meta.json` (torch, oneDNN and OpenMP versions, lscpu,
cpu flags, affinity, clocks sampled while busy, each variant's environment). Each variant runs
in a child process because oneDNN and OpenMP read their environment once, at start:

  gemm_threads      bf16 GEMMs (Llama-3.1-8B QKV/gate_up shapes at M = 256/1,024/4,096, a
                    4,096³ square) at 1/4/8/12/16 threads, unpinned as calibrate ran them;
  gemm_pinned       the same, OMP_PROC_BIND=close OMP_PLACES=cores (one thread per core);
  gemm_no_amx       the same, ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16: AVX-512 BF16 without AMX
                    (the AMX speed-up on this host);
  gemm_fp32_out     bf16 inputs with an fp32 output (what oneDNN accumulates in anyway):
                    does the bf16 down-conversion cost anything;
  pairs             two pinned threads on vCPU 0 and vCPU j, j = 1..15: a pair sharing one
                    physical core's AMX unit (SMT siblings behind the hypervisor) runs at
                    ~1x one thread instead of ~2x;
  attention         CPU decode attention at batch 1-256, context 128-2,048: contiguous KV
                    (as calibrate) and paged (16-token blocks gathered through a block table).
Per point: median time, TFLOP/s, and the clock read from /proc/cpuinfo during the run.
Afterwards: `python -m simserve.calibrate.amx_summary DIR`. `--dry-run` checks here, without
PyTorch, that a synthetic folder in this layout packs into what a call returns and summarizes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "gemm_threads": {},
    "gemm_pinned": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
    "gemm_no_amx": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "OMP_PROC_BIND": "close",
                    "OMP_PLACES": "cores"},
    "gemm_fp32_out": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
    "pairs": {},
    "attention": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
}
# (name, M, K, N): Llama-3.1-8B packed QKV and gate/up at three batch sizes, a square GEMM
SHAPES = [(f"{op}_m{m}", m, k, n) for m in (256, 1024, 4096)
          for op, k, n in (("qkv", 4096, 6144), ("gate_up", 4096, 28672))] + [
    ("square", 4096, 4096, 4096)]
THREADS = (1, 4, 8, 12, 16)


def _clock_mhz() -> float | None:
    try:
        mhz = [float(line.split(":")[1]) for line in open("/proc/cpuinfo")
               if line.startswith("cpu MHz")]
        return sum(mhz) / len(mhz) if mhz else None
    except OSError:
        return None


def _time(fn, target_s: float) -> tuple[float, float | None]:
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    reps = max(3, min(50, int(target_s / one)))
    ts, clocks = [], []
    for i in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        if i == reps // 2:
            clocks.append(_clock_mhz())
    ts.sort()
    return ts[len(ts) // 2] * 1e6, clocks[0] if clocks else None


def _rows_gemm(torch, variant: str, smoke: bool, out_rows: list) -> None:
    shapes = SHAPES[:1] if smoke else SHAPES
    threads = (1, 2) if smoke else THREADS
    for name, m, k, n in shapes:
        if smoke:
            m, k, n = min(m, 64), min(k, 256), min(n, 256)
        x = torch.randn(m, k).bfloat16()
        w = torch.randn(n, k).bfloat16() * 0.02
        for t in threads:
            torch.set_num_threads(t)
            if variant == "gemm_fp32_out":
                wt = w.t().float()
                fn = lambda: torch.matmul(x.float(), wt)  # noqa: E731  fp32 reference GEMM
            else:
                fn = lambda: torch.matmul(x, w.t())  # noqa: E731
            us, mhz = _time(fn, 0.05 if smoke else 0.4)
            out_rows.append({"variant": variant, "shape": name, "m": m, "k": k, "n": n,
                             "threads": t, "median_us": us, "tflops": 2 * m * k * n / us / 1e6,
                             "clock_mhz": mhz})


def _rows_pairs(torch, smoke: bool, out_rows: list) -> None:
    m, k, n = (64, 256, 256) if smoke else (1024, 4096, 6144)
    x = torch.randn(m, k).bfloat16()
    w = torch.randn(n, k).bfloat16() * 0.02
    ncpu = len(os.sched_getaffinity(0))
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {0})
    single, _ = _time(lambda: torch.matmul(x, w.t()), 0.2)
    for j in range(1, min(ncpu, 3 if smoke else 16)):
        os.sched_setaffinity(0, {0, j})
        torch.set_num_threads(2)
        us, mhz = _time(lambda: torch.matmul(x, w.t()), 0.2)
        out_rows.append({"variant": "pairs", "shape": f"vcpu0+vcpu{j}", "m": m, "k": k, "n": n,
                         "threads": 2, "median_us": us, "tflops": 2 * m * k * n / us / 1e6,
                         "speedup_vs_one": single / us, "clock_mhz": mhz})


def _rows_attention(torch, smoke: bool, out_rows: list) -> None:
    import torch.nn.functional as F
    nh, nkv, d, blk = 32, 8, 128, 16
    torch.set_num_threads(2 if smoke else 16)
    for b in ((1, 4) if smoke else (1, 16, 64, 256)):
        for c in ((128,) if smoke else (128, 512, 2048)):
            q = torch.randn(b, nh, 1, d).bfloat16()
            k = torch.randn(b, nkv, c, d).bfloat16()
            v = torch.randn(b, nkv, c, d).bfloat16()
            pool = torch.randn(2, b * c // blk + 8, blk, nkv, d).bfloat16()   # paged KV
            table = torch.randperm(pool.shape[1])[: b * c // blk].view(b, c // blk)

            def paged(q=q, table=table, pool=pool, b=b, c=c):
                kk = pool[0][table].view(b, c, nkv, d).transpose(1, 2)
                vv = pool[1][table].view(b, c, nkv, d).transpose(1, 2)
                return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)
            for impl, fn in (("contiguous", lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                    q, k, v, enable_gqa=True)), ("paged_gather", paged)):
                us, mhz = _time(fn, 0.05 if smoke else 0.3)
                nbytes = 2 * b * c * nkv * d * 2
                out_rows.append({"variant": "attention", "shape": impl, "batch": b, "context": c,
                                 "threads": torch.get_num_threads(), "median_us": us,
                                 "gbps": nbytes / us / 1e3, "clock_mhz": mhz})


def child(variant: str, out: Path, smoke: bool) -> None:
    import torch
    rows: list = []
    {"pairs": lambda: _rows_pairs(torch, smoke, rows),
     "attention": lambda: _rows_attention(torch, smoke, rows)}.get(
        variant, lambda: _rows_gemm(torch, variant, smoke, rows))()
    (out / f"{variant}.json").write_text(json.dumps(rows))


def _meta(out: Path) -> dict:
    import torch

    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                                  timeout=20).stdout
        except Exception as exc:  # noqa: BLE001  (recorded, not fatal)
            return f"failed: {exc}"
    return {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(sys.argv), "python": platform.python_version(),
            "torch": torch.__version__, "torch_config": torch.__config__.show(),
            "mkldnn": torch.backends.mkldnn.is_available(), "lscpu": sh("lscpu"),
            "numactl": sh("numactl -H"), "flags": sorted({f for f in sh(
                "grep -m1 flags /proc/cpuinfo").split() if "amx" in f or "avx512" in f}),
            "affinity": sorted(os.sched_getaffinity(0)), "variants": VARIANTS,
            "kernel": platform.release()}


def _synthetic(out: Path) -> None:
    """A folder in the layout main() writes, with rows shaped as the row builders make them:
    GEMMs at 10 % of peak unpinned, 15 % pinned, a third of that without AMX; vCPU 8 pairs
    with vCPU 0 at 1.05x (an SMT sibling), the others at 1.9x."""
    (out / "onednn_verbose").mkdir(parents=True, exist_ok=True)
    rows: list = []
    peak = 16 * 2.0 * 1024 / 1e3
    for variant, frac in (("gemm_threads", 0.10), ("gemm_pinned", 0.15),
                          ("gemm_no_amx", 0.05), ("gemm_fp32_out", 0.04)):
        for name, m, k, n in SHAPES:
            for t in THREADS:
                tf = peak * frac * t / 16
                rows.append({"variant": variant, "shape": name, "m": m, "k": k, "n": n,
                             "threads": t, "median_us": 2 * m * k * n / tf / 1e6,
                             "tflops": tf, "clock_mhz": 2000.0})
        (out / f"{variant}.json").write_text(json.dumps(rows[-len(SHAPES) * len(THREADS):]))
        (out / "onednn_verbose" / f"{variant}.txt").write_text("onednn_verbose,exec,cpu\n")
    for j in range(1, 16):
        rows.append({"variant": "pairs", "shape": f"vcpu0+vcpu{j}", "m": 1024, "k": 4096,
                     "n": 6144, "threads": 2, "median_us": 1.0, "tflops": 1.0,
                     "speedup_vs_one": 1.05 if j == 8 else 1.9, "clock_mhz": 2000.0})
    for impl, gbps in (("contiguous", 120.0), ("paged_gather", 60.0)):
        rows.append({"variant": "attention", "shape": impl, "batch": 64, "context": 2048,
                     "threads": 16, "median_us": 1.0, "gbps": gbps, "clock_mhz": 2000.0})
    keys = sorted({k for r in rows for k in r})
    import csv
    with open(out / "amx_probe.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    (out / "meta.json").write_text(json.dumps({"variants": VARIANTS, "dry_run": True}))


def dry_run() -> int:
    """Here, no PyTorch: the raw layout needs packing (it holds more files than a call
    returns), the pack comes back whole, and amx_summary reads the synthetic answers."""
    import tempfile
    from simserve.calibrate import amx_summary
    from simserve import device_check as D
    probs = []
    with tempfile.TemporaryDirectory() as tmp:
        raw, out = Path(tmp) / "raw", Path(tmp) / "OUT"
        _synthetic(raw)
        if not D.return_problems(str(raw)):
            probs.append("the raw folder would come back unpacked: the plan's tar is not needed")
        probs += D.return_problems(os.path.dirname(D.pack(str(raw), str(out), "amx")))
        d = amx_summary.summarize(Path(D.unpack(str(out / "amx.tar.xz"), str(Path(tmp) / "b"))))
        print(amx_summary.format_summary(d))
        if abs((d["efficiency"]["gemm_pinned"] or 0) - 0.15) > 1e-9:
            probs.append(f"pinned efficiency {d['efficiency']['gemm_pinned']}, built at 0.15")
        if d["siblings_of_vcpu0"] != ["vcpu8"]:
            probs.append(f"siblings {d['siblings_of_vcpu0']}, built as vcpu8")
    return D.report("amx_probe", probs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--dry-run", action="store_true", help="check the plan here, no PyTorch")
    ap.add_argument("--total-s", type=float, default=540.0)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes: does it run here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.dry_run:
        return dry_run()
    if not a.out:
        ap.error("--out is required (or --dry-run)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.child:
        child(a.child, out, a.smoke)
        return 0
    (out / "onednn_verbose").mkdir(exist_ok=True)
    meta, rows, t_end = _meta(out), [], time.monotonic() + a.total_s
    for variant, env in VARIANTS.items():
        left = t_end - time.monotonic()
        if left < 20:
            meta.setdefault("skipped", []).append(variant)
            continue
        e = dict(os.environ, **env, ONEDNN_VERBOSE="1")
        cmd = [sys.executable, "-m", "simserve.calibrate.amx_probe", "--out", str(out),
               "--child", variant] + (["--smoke"] if a.smoke else [])
        try:
            r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=left)
            (out / "onednn_verbose" / f"{variant}.txt").write_text(r.stdout[-2_000_000:]
                                                                   + r.stderr[-200_000:])
            rows += json.loads((out / f"{variant}.json").read_text())
        except (subprocess.TimeoutExpired, FileNotFoundError, json.JSONDecodeError) as exc:
            meta.setdefault("failed", {})[variant] = str(exc)
    import csv
    keys = sorted({k for r in rows for k in r})
    with open(out / "amx_probe.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"{len(rows)} rows -> {out / 'amx_probe.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
