"""Timing helpers and the CSV sink shared by the calibration parts (imports torch)."""
from __future__ import annotations

import csv
import math
import os
import statistics
import sys
import time

import torch

# One schema for every CSV so a fitter can read them all the same way; blank = not applicable.
COLUMNS = [
    "part", "model", "tp", "op", "impl", "dtype", "tokens", "batch", "context_sum", "chunk",
    "context", "k", "n", "heads", "kv_heads", "head_dim", "bytes", "flops", "median_us", "p10_us",
    "p90_us", "mean_us", "min_us", "repeats", "threads", "timer", "starved", "note",
]

T0 = time.monotonic()


def log(*args) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s]", *args, flush=True)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else str(v)
    return v


class CsvSink:
    """Appends one row per measured point and flushes at once, so a killed run keeps its data."""

    def __init__(self, path: str):
        self.path = path
        new = not os.path.exists(path)
        self.f = open(path, "a", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS)
        if new:
            self.w.writeheader()
            self.f.flush()
        self.count = 0

    def add(self, **row) -> None:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise KeyError(f"unknown CSV columns {sorted(unknown)}")
        self.w.writerow({c: _fmt(row.get(c, "")) for c in COLUMNS})
        self.f.flush()
        self.count += 1

    def close(self) -> None:
        self.f.close()


class Budget:
    """A part's time budget, also bounded by the run's global deadline (time.monotonic)."""

    def __init__(self, seconds: float, deadline: float | None = None):
        self.t0 = time.monotonic()
        self.seconds = seconds
        self.deadline = deadline
        self.skipped = 0

    def left(self) -> float:
        left = self.seconds - (time.monotonic() - self.t0)
        if self.deadline is not None:
            left = min(left, self.deadline - time.monotonic())
        return left

    def ok(self, need_s: float = 0.0) -> bool:
        if self.left() > need_s:
            return True
        self.skipped += 1
        return False

    def used(self) -> float:
        return time.monotonic() - self.t0


def stats(times_us: list[float]) -> dict:
    s = sorted(times_us)
    n = len(s)

    def q(p):  # nearest-rank quantile
        return s[min(n - 1, max(0, int(round(p * (n - 1)))))]

    return {
        "median_us": statistics.median(s), "p10_us": q(0.1), "p90_us": q(0.9),
        "mean_us": sum(s) / n, "min_us": s[0], "repeats": n,
    }


def bench_cuda(fn, target_ms: float = 25.0, min_reps: int = 10, max_reps: int = 100,
               warmup: int = 2) -> dict:
    """Time fn(i) (i rotates the inputs) with one CUDA event pair per call.

    A GPU sleep is queued ahead of short ops so that the host's enqueue time never shows up
    as idle gaps between the events: each sample is the kernel(s) alone.
    """
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    h0 = time.perf_counter()
    for i in range(3):
        fn(warmup + i)
    host_s = (time.perf_counter() - h0) / 3  # host enqueue time per call
    e1.record()
    torch.cuda.synchronize()
    est_ms = max(e0.elapsed_time(e1) / 3, 1e-3)
    reps = int(min(max_reps, max(min_reps, target_ms / est_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    if est_ms < 2.0:
        # Hold the GPU until the host has queued every call (2x the measured enqueue time),
        # else a starved GPU waits on the host between a start event and its kernel.
        cover_s = min(0.3, 2.0 * reps * (host_s + 5e-6) + 1e-3)
        torch.cuda._sleep(int(cover_s * 2.0e9))
    for i in range(reps):
        starts[i].record()
        fn(i)
        ends[i].record()
    torch.cuda.synchronize()
    out = stats([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])
    # QA: idle gaps between consecutive calls mean the queue ran dry (host-bound samples)
    gaps = [ends[i].elapsed_time(starts[i + 1]) * 1e3 for i in range(reps - 1)]
    out["starved"] = sum(g > 3.0 for g in gaps)
    out["timer"] = "cuda_events"
    return out


def bench_wall(fn, target_s: float = 0.2, min_reps: int = 5, max_reps: int = 50,
               warmup: int = 1, sync=None) -> dict:
    """Time fn(i) with the host clock (CPU ops, pageable copies); sync() after each call."""
    for i in range(warmup):
        fn(i)
    if sync:
        sync()
    t = time.perf_counter()
    fn(warmup)
    if sync:
        sync()
    est = max(time.perf_counter() - t, 1e-6)
    reps = int(min(max_reps, max(min_reps, target_s / est)))
    ts = []
    for i in range(reps):
        t = time.perf_counter()
        fn(i)
        if sync:
            sync()
        ts.append((time.perf_counter() - t) * 1e6)
    out = stats(ts)
    out["timer"] = "wall"
    return out


def bench(fn, device: str, **kw) -> dict:
    if device == "cuda":
        return bench_cuda(fn, **kw)
    kw2 = {"min_reps": min(kw.get("min_reps", 3), 3), "max_reps": min(kw.get("max_reps", 20), 20)}
    return bench_wall(fn, target_s=kw.get("target_ms", 25.0) / 1e3, **kw2)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    ref = ref.double()
    e = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    if not math.isfinite(e):
        return float("inf")
    return e


def rand(shape, device: str, dtype=torch.bfloat16, std: float = 1.0) -> torch.Tensor:
    """Random (never zero) data. On the host, tile a random block: randn of gigabytes is slow."""
    n = math.prod(shape)
    if device != "cpu" or n <= (1 << 22):
        if n <= (1 << 26):
            return (torch.randn(*shape, device=device, dtype=torch.float32) * std).to(dtype)
        t = torch.randn(*shape, device=device, dtype=dtype)
        return t if std == 1.0 else t.mul_(std)
    base = (torch.randn(1 << 22) * std).to(dtype)
    reps = -(-n // base.numel())
    t = torch.empty(n, dtype=dtype)
    for r in range(reps):
        lo = r * base.numel()
        hi = min(n, lo + base.numel())
        t[lo:hi].copy_(base[: hi - lo])
    return t.view(*shape)


def free_gpu() -> None:
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def fmt_row(d: dict) -> str:
    return f"med {d['median_us']:.1f}us p10 {d['p10_us']:.1f} p90 {d['p90_us']:.1f} n={d['repeats']}"


def eprint(*a):
    print(*a, file=sys.stderr, flush=True)
