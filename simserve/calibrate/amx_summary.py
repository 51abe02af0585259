"""What an `amx_probe` run settles, read from its folder (no PyTorch needed).

    python -m simserve.calibrate.amx_summary DIR [--cpu xeon-emr]

DIR holds `amx_probe.csv` and `meta.json` (`python -m simserve.calibrate.amx_probe`). Printed,
each beside the assumption it replaces:
- the AMX efficiency a 16-thread bf16 GEMM reaches on compute-bound shapes (M >= 1,024), as a
  fraction of cores x base clock x 1,024 FLOP/cycle: `CPU_EFFICIENCY["amx"]`
  (simserve/hardware/datasheets.py), unpinned as `simserve calibrate` ran it and pinned;
- pinning's gain (`gemm_pinned` over `gemm_threads`, 16 threads) and AMX's gain over AVX-512
  BF16 (`gemm_pinned` over `gemm_no_amx`);
- which vCPUs pair with vCPU 0 at under 1.3x one thread (SMT siblings sharing an AMX unit);
- CPU decode attention's best streaming rate, contiguous and paged: against
  `CPU_EFFICIENCY["memory"]` x the datasheet's DRAM peak.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

SIBLING_BELOW = 1.3     # a pair of threads slower than this over one thread shares a core


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def load(folder: Path) -> list[dict]:
    with open(folder / "amx_probe.csv") as f:
        return [{k: (_num(v) if k not in ("variant", "shape") else v) for k, v in r.items()}
                for r in csv.DictReader(f)]


def _best(rows, variant: str, threads: int) -> float | None:
    xs = [r["tflops"] for r in rows if r["variant"] == variant and r.get("threads") == threads
          and (r.get("m") or 0) >= 1024 and r.get("tflops")]
    return max(xs) if xs else None


def _ratio(rows, num: str, den: str, threads: int) -> float | None:
    """Median over shapes of num's TFLOP/s over den's at `threads`."""
    a = {r["shape"]: r["tflops"] for r in rows if r["variant"] == num and r.get("threads") == threads}
    b = {r["shape"]: r["tflops"] for r in rows if r["variant"] == den and r.get("threads") == threads}
    rs = [a[s] / b[s] for s in a.keys() & b.keys() if a[s] and b[s]]
    return statistics.median(rs) if rs else None


def summarize(folder: Path, cpu: str = "xeon-emr") -> dict:
    from simserve.hardware.datasheets import CPU_EFFICIENCY, CPUS
    spec = CPUS[cpu]
    rows = load(folder)
    peak = spec["cores"] * spec["base_ghz"] * spec["amx_bf16_flop_per_cycle_per_core"] / 1e3
    threads = spec["cores"]
    eff = {v: (b / peak if b else None) for v in ("gemm_threads", "gemm_pinned", "gemm_no_amx")
           for b in [_best(rows, v, threads)]}
    pairs = [r for r in rows if r["variant"] == "pairs"]
    att = {impl: max((r["gbps"] for r in rows if r["variant"] == "attention"
                      and r["shape"] == impl and r.get("gbps")), default=None)
           for impl in ("contiguous", "paged_gather")}
    clocks = [r["clock_mhz"] for r in rows if r.get("clock_mhz")]
    return {"cpu": cpu, "peak_tflops": peak, "efficiency": eff,
            "assumed_amx": CPU_EFFICIENCY["amx"],
            "pinned_gain": _ratio(rows, "gemm_pinned", "gemm_threads", threads),
            "amx_gain": _ratio(rows, "gemm_pinned", "gemm_no_amx", threads),
            "siblings_of_vcpu0": [r["shape"].split("+")[1] for r in pairs
                                  if (r.get("speedup_vs_one") or 0) < SIBLING_BELOW],
            "pairs": len(pairs), "attention_gbps": att,
            "assumed_memory_gbps": CPU_EFFICIENCY["memory"] * spec["dram_gbps_peak"],
            "busy_clock_mhz": statistics.median(clocks) if clocks else None}


def format_summary(d: dict) -> str:
    f = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"   # noqa: E731
    e = d["efficiency"]
    return "\n".join([
        f"{d['cpu']}: AMX peak {d['peak_tflops']:.1f} TFLOP/s at base clock "
        f"(busy clock read {f(d['busy_clock_mhz'], 0)} MHz)",
        f"bf16 GEMM efficiency, 16 threads, M >= 1024: unpinned {f(e['gemm_threads'])}, pinned "
        f"{f(e['gemm_pinned'])}, AMX off {f(e['gemm_no_amx'])} "
        f"(CPU_EFFICIENCY['amx'] assumed {d['assumed_amx']})",
        f"pinning gain {f(d['pinned_gain'], 2)}x; AMX over AVX-512 BF16 {f(d['amx_gain'], 2)}x",
        f"vCPUs pairing with vCPU 0 under {SIBLING_BELOW}x: "
        f"{', '.join(d['siblings_of_vcpu0']) or 'none'} (of {d['pairs']} pairs)",
        f"decode attention best GB/s: contiguous {f(d['attention_gbps']['contiguous'], 1)}, "
        f"paged {f(d['attention_gbps']['paged_gather'], 1)} "
        f"(assumed achievable {d['assumed_memory_gbps']:.1f})"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--cpu", default="xeon-emr")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    try:
        d = summarize(a.dir, a.cpu)
    except (OSError, KeyError) as exc:
        print(f"amx_summary: {exc}", file=sys.stderr)
        return 2
    print(format_summary(d))
    if a.json:
        a.json.write_text(json.dumps(d, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
