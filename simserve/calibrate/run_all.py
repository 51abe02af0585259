"""Run every calibration part in priority order, each within a time budget, into one folder.

    python3 -m simserve.calibrate.run_all --out DIR [--total-s 520] [--smoke] [--parts a,b]

Writes gpu_dense.csv, gpu_prefill_attn.csv, gpu_decode_attn.csv, links.csv, cpu_ops.csv,
launch.csv (one row per point, same columns) and meta.json (device, versions, checks).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback

PARTS = ["dense", "prefill", "decode", "links", "launch", "cpu"]
BUDGET_S = {"dense": 170, "prefill": 55, "decode": 70, "links": 25, "cpu": 120, "launch": 40}
DENSE_CONFIGS = [("llama-3.1-8b", 1), ("qwen3-14b", 1), ("llama-3.1-8b", 2), ("qwen3-14b", 2),
                 ("llama-3.1-8b", 4), ("qwen3-14b", 4), ("qwen3-32b", 1), ("qwen3-32b", 2),
                 ("qwen3-32b", 4), ("llama-3.1-8b", 8), ("qwen3-14b", 8), ("qwen3-32b", 8)]
CHUNKS = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
CONTEXTS = [0, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768]
DEC_BATCH = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
DEC_CTX = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]

# `--grid dense`: about sqrt(2) steps, so that holding out every fourth point still leaves
# neighbours close enough to interpolate across cuBLAS/FlashAttention kernel switches
DENSE_TOKENS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256,
                320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072,
                3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 14336, 16384]
# `--grid fine`: GEMMs only, at the granularity an engine's batches take (every 16 tokens up to
# 1K, then 32, 128, 512): cuBLAS changes kernels between neighbouring counts, so a coarse grid
# cannot follow the steps
FINE_TOKENS = ([1, 2, 4, 8, 12] + list(range(16, 1025, 16)) + list(range(1056, 2049, 32))
               + list(range(2176, 4097, 128)) + list(range(4608, 16385, 512)))
DENSE_CONTEXTS = [0, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
                  12288, 16384, 24576, 32768]
DENSE_CPU_TOKENS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
                    1024]
DENSE_DEC_CTX = [64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
                 12288, 16384, 24576, 32768]


def _sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as ex:  # noqa: BLE001
        return f"failed: {ex}"


def env_info(torch) -> dict:
    info = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": os.environ.get("CAL_CMDLINE") or " ".join([sys.executable, "-m", __spec__.name if __spec__ else "run_all", *sys.argv[1:]]),
        "argv": sys.argv,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "torch_num_threads_default": torch.get_num_threads(),
        "os_cpu_count": os.cpu_count(),
    }
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception as ex:  # noqa: BLE001
        info["triton"] = f"unavailable: {ex}"
    try:
        cpuinfo = open("/proc/cpuinfo").read().split("\n\n")[0]
        fields = dict(line.split(":", 1) for line in cpuinfo.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        flags = fields.get("flags", "").split()
        info["cpu_model"] = fields.get("model name")
        info["cpu_flags_of_interest"] = sorted(f for f in flags if f.startswith(("amx", "avx512")))
        info["cpu_flags_all"] = " ".join(flags)
    except Exception as ex:  # noqa: BLE001
        info["cpu_model"] = f"unreadable: {ex}"
    info["lscpu"] = _sh("lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA|L1d|L2|L3|MHz'")
    info["meminfo"] = _sh("grep -E 'MemTotal|MemAvailable' /proc/meminfo")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = {
            "name": p.name, "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
            "memory_GiB": round(p.total_memory / 2**30, 1),
            "l2_MB": round(getattr(p, "L2_cache_size", 0) / 1e6, 1),
        }
        info["nvidia_smi"] = _sh(
            "nvidia-smi --query-gpu=name,driver_version,pci.bus_id,clocks.sm,clocks.mem,clocks.max.sm,"
            "clocks.max.mem,power.limit,temperature.gpu,pcie.link.gen.current,pcie.link.width.current "
            "--format=csv")
    return info


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--total-s", type=float, default=520.0, help="global deadline from start")
    ap.add_argument("--smoke", action="store_true", help="tiny grids, to check the scripts")
    ap.add_argument("--grid", choices=("standard", "dense", "fine"), default="standard",
                    help="dense: ~sqrt(2)-spaced token and context grids (longer run); "
                         "fine: GEMMs only, every 16-512 tokens (dense part)")
    ap.add_argument("--dense-configs", default=None,
                    help="model:tp,... to measure in the dense part (default: all)")
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu (local test)")
    ap.add_argument("--cpu-threads", default="16,12")
    ap.add_argument("--cpu-models", default="llama-3.1-8b",
                    help="catalog models whose dense ops the cpu part measures")
    ap.add_argument("--cpu-attention", choices=("yes", "no"), default="yes")
    ap.add_argument("--test-model", default=None,
                    help="local testing only: a catalog name used in place of every model")
    return ap


class _Run:
    """One calibration run: the flags, the grids they pick, the CSV sinks and the checks.
    Each part is a method writing its rows; it returns the part's status."""

    def __init__(self, args, device: str, deadline: float, checks: dict, meta: dict):
        from . import gpu_ops
        self.args, self.device, self.deadline = args, device, deadline
        self.checks, self.meta = checks, meta
        self.sm = sm = args.smoke
        self.dg = dg = args.grid == "dense"
        self.fine = fine = args.grid == "fine"
        self.tokens = [1, 16, 256, 1024] if sm else (
            FINE_TOKENS if fine else (DENSE_TOKENS if dg else gpu_ops.TOKENS))
        self.contexts = DENSE_CONTEXTS if dg else CONTEXTS
        self.dec_ctx = DENSE_DEC_CTX if dg else DEC_CTX
        self.sinks: dict = {}
        self.tm = args.test_model
        self.L8 = self.tm or "llama-3.1-8b"

    def sink(self, name):
        from .timing import CsvSink
        if name not in self.sinks:
            self.sinks[name] = CsvSink(os.path.join(self.args.out, name))
        return self.sinks[name]

    def own_budget(self, part: str) -> float:
        """The part's own seconds (before what earlier parts left over is carried in)."""
        own = BUDGET_S[part] * (0.2 if self.sm else ((3.0 if part == "cpu" else 2.0) if self.dg else 1.0))
        if self.fine:
            own = self.args.total_s
        return own

    def run_part(self, part: str, budget) -> str:
        fn = {"dense": self.dense, "prefill": self.prefill, "decode": self.decode,
              "links": self.links, "cpu": self.cpu, "launch": self.launch}.get(part)
        if fn is None:
            return f"unknown part {part}"
        return fn(budget)

    def dense(self, budget) -> str:
        from . import gpu_ops
        sm, tm, args, device = self.sm, self.tm, self.args, self.device
        s = self.sink("gpu_dense.csv")
        gpu_ops.ceilings(s, device, self.checks, small=sm)
        cfgs = DENSE_CONFIGS[:2] if sm else DENSE_CONFIGS
        if args.dense_configs:
            cfgs = [(m, int(t)) for m, t in (c.split(":") for c in args.dense_configs.split(","))]
        if tm:
            cfgs = [(tm, tp) for _, tp in cfgs]
        gpu_ops.dense(s, budget, device, cfgs, self.tokens, self.checks, elementwise_ops=not self.fine,
                      lm_head=not self.fine)
        return "ok"

    def prefill(self, budget) -> str:
        from . import gpu_ops
        sm, tm, device, checks, L8 = self.sm, self.tm, self.device, self.checks, self.L8
        s = self.sink("gpu_prefill_attn.csv")
        gpu_ops.prefill(s, budget, device, L8, [1, 2] if sm else [1, 2, 4],
                        [16, 256] if sm else CHUNKS, [0, 1024] if sm else self.contexts, checks)
        if not sm:  # the Qwen3 head configs at TP1 (40/8 and 64/8 heads)
            for qm in ("qwen3-14b", "qwen3-32b"):
                gpu_ops.prefill(s, budget, device, tm or qm, [1], CHUNKS, self.contexts, checks)
        if not self.dg:
            gpu_ops.mixed_varlen(s, budget, device, L8, checks, **(
                dict(prefills=(512,), decodes=(8,), dctx=(1024,)) if sm else {}))
        return "ok"

    def decode(self, budget) -> str:
        from . import gpu_ops
        sm = self.sm
        s = self.sink("gpu_decode_attn.csv")
        gpu_ops.decode(s, budget, self.device, self.L8, [1, 2] if sm else [1, 2, 4],
                       [1, 64] if sm else DEC_BATCH, [64, 4096] if sm else self.dec_ctx,
                       (1 << 20) if sm else 512 * 32768, self.checks)
        return "ok"

    def links(self, budget) -> str:
        from . import links
        sm = self.sm
        if self.device != "cuda":
            return "skipped: no cuda"
        links.links(self.sink("links.csv"), budget, self.checks,
                    max_bytes=(64 << 20) if sm else (1 << 30),
                    concurrent_sizes=(16 << 20,) if sm else (16 << 20, 64 << 20, 256 << 20))
        return "ok"

    def cpu(self, budget) -> str:
        from . import cpu_ops
        from .timing import Budget
        sm, dg, tm, args = self.sm, self.dg, self.tm, self.args
        s = self.sink("cpu_ops.csv")
        ths = [int(t) for t in args.cpu_threads.split(",")]
        ncpu = os.cpu_count() or 1
        for i, th in enumerate(ths):
            th = min(th, ncpu)
            # split what is left between thread counts; attention gets a third of each
            share = budget.left() / (len(ths) - i)
            attn = args.cpu_attention == "yes"
            b1 = Budget(share * (0.65 if attn else 1.0), self.deadline)
            for cm in ([tm] if tm else args.cpu_models.split(",")):
                cpu_ops.cpu_dense(s, b1, self.checks, th, cm,
                                  tokens=[1, 8, 64] if sm else (
                                      DENSE_CPU_TOKENS if dg else cpu_ops.CPU_TOKENS),
                                  target_s=0.02 if sm else (0.25 if dg else 0.1))
            if not attn:
                continue
            b2 = Budget(share - b1.used(), self.deadline)
            cpu_ops.cpu_attn(s, b2, self.checks, th, self.L8,
                             batches=(1, 4) if sm else (
                                 (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if dg
                                 else (1, 4, 16, 64, 256, 512)),
                             contexts=(128, 512) if sm else (
                                 (128, 256, 512, 1024, 2048, 4096, 8192, 16384) if dg
                                 else (128, 512, 2048, 8192, 16384)),
                             max_tokens=(1 << 14) if sm else (4 << 20),
                             target_s=0.02 if sm else (0.2 if dg else 0.1))
        self.meta["parts"]["cpu_threads"] = ths
        return "ok"

    def launch(self, budget) -> str:
        from . import launch
        if self.device != "cuda":
            return "skipped: no cuda"
        launch.launch(self.sink("launch.csv"), budget, self.checks, small=self.sm)
        return "ok"


def _run_parts(run: _Run, parts: list[str], write_meta, torch) -> None:
    """The parts in order, each in its own budget plus what the parts before it left unused."""
    from .timing import Budget, log
    meta, device = run.meta, run.device
    carry = 0.0
    for part in parts:
        own = run.own_budget(part)
        budget = Budget(own + carry, run.deadline)
        log(f"=== part {part}: budget {budget.left():.0f}s (own {own:.0f} + carried {carry:.0f}) ===")
        try:
            status = run.run_part(part, budget)
        except Exception as ex:  # noqa: BLE001
            traceback.print_exc()
            status = f"failed: {type(ex).__name__}: {ex}"[:500]
            try:
                torch.cuda.synchronize() if device == "cuda" else None
            except Exception:  # noqa: BLE001
                pass
        used = budget.used()
        carry = max(0.0, own + carry - used)
        meta["parts"][part] = {"status": status, "used_s": round(used, 1), "budget_s": round(own, 1),
                               "points_skipped_for_time": budget.skipped}
        log(f"=== part {part}: {status}, {used:.0f}s used ===")
        if device == "cuda":
            from .timing import free_gpu
            free_gpu()
        write_meta()


def main(argv=None) -> int:
    args = _parser().parse_args(argv)

    import torch  # only here, inside simserve.calibrate

    from . import gpu_ops, launch, links  # noqa: F401 - imported before any part runs, as always
    from . import cpu_ops  # noqa: F401
    from .timing import log

    os.makedirs(args.out, exist_ok=True)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    t_start = time.monotonic()
    deadline = t_start + args.total_s
    parts = [p for p in args.parts.split(",") if p]
    meta = {"env": env_info(torch), "device_used": device, "smoke": args.smoke,
            "budgets_s": BUDGET_S, "total_s": args.total_s, "checks": {}, "parts": {}}
    checks = meta["checks"]

    def write_meta():
        meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
        with open(os.path.join(args.out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1, default=str)

    write_meta()
    log("env:", json.dumps({k: v for k, v in meta["env"].items() if k not in ("cpu_flags_all",)}, default=str)[:3000])
    torch.manual_seed(0)
    run = _Run(args, device, deadline, checks, meta)
    meta["grid"] = args.grid
    _run_parts(run, parts, write_meta, torch)
    sinks = run.sinks
    meta["rows"] = {name: s.count for name, s in sinks.items()}
    meta["env_end_nvidia_smi"] = env_info(torch).get("nvidia_smi") if device == "cuda" else None
    write_meta()
    for s in sinks.values():
        s.close()
    log("rows:", meta["rows"])
    log("checks:", json.dumps(checks, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
