"""The timer and bookkeeping of `simserve.calibrate.collectives`: one `Ctx` per process holds the
process group, agrees decisions across ranks (max over ranks), times loops of N back-to-back
calls (CUDA events on every rank, max over ranks per repeat), writes one CSV row per point with
nccl-tests' bus-bandwidth conventions, and counts the correctness checks in meta.json.
Imports no torch itself: the caller hands `Ctx` its `torch` and `torch.distributed`.
"""
from __future__ import annotations

import math
import time

GB = 1e9


class Ctx:
    def __init__(self, torch, dist, rank, world, device, cuda, sink, meta, deadline, args):
        self.torch, self.dist = torch, dist
        self.rank, self.world, self.device, self.cuda = rank, world, device, cuda
        self.sink, self.meta, self.deadline, self.args = sink, meta, deadline, args
        self.flag = torch.zeros(1, device=device, dtype=torch.float32)
        self.syncbuf = torch.ones(1, device=device, dtype=torch.float32)

    # ---- agreement between ranks (every decision that changes the number of calls) ----
    def agree_max(self, vals: list[float]) -> list[float]:
        t = self.torch.tensor(vals, device=self.device, dtype=self.torch.float64 if not self.cuda else self.torch.float32)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.tolist()

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def stop(self, need_s: float) -> bool:
        """True (on every rank) when any rank has less than need_s before the deadline."""
        return self.agree_max([1.0 if self.time_left() < need_s else 0.0])[0] > 0

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def log(self, *a):
        if self.rank == 0:
            from .timing import log
            log(*a)

    def gen(self, seed: int):
        g = self.torch.Generator(device=self.device)
        g.manual_seed(seed)
        return g

    def randn(self, n: int, seed: int):
        """Random bf16 values (never zero-filled) from a seeded generator, so any rank can rebuild them."""
        torch = self.torch
        x = torch.randn(n, generator=self.gen(seed), device=self.device, dtype=torch.float32)
        return x.to(torch.bfloat16)

    # ---- the timer: loops of N calls, events on each rank, max over ranks per repeat ----
    def loop_time(self, fn, reset=None, repeats: int = 7, target_ms: float = 4.0, nmin: int = 3,
                  nmax: int = 100, warmup: int = 3, cover: bool = True, graph_fn=None) -> dict:
        torch = self.torch
        if reset:
            reset()
        for _ in range(warmup):
            fn()
        self.sync()
        # estimate the per-call device time and the host enqueue time
        k = 5
        if self.cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.dist.all_reduce(self.syncbuf, op=self.dist.ReduceOp.MAX)
            e0.record()
            h0 = time.perf_counter()
            for _ in range(k):
                fn()
            host = (time.perf_counter() - h0) / k
            e1.record()
            torch.cuda.synchronize()
            est = e0.elapsed_time(e1) / k  # ms
        else:
            self.dist.all_reduce(self.syncbuf, op=self.dist.ReduceOp.MAX)
            h0 = time.perf_counter()
            for _ in range(k):
                fn()
            host = est = (time.perf_counter() - h0) / k
            est *= 1e3
        est, host = self.agree_max([max(est, 1e-4), host])
        n = int(min(nmax, max(nmin, target_ms / est)))
        per = []
        if self.cuda:
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
            for r in range(repeats):
                if reset:
                    reset()
                if cover:
                    # hold this GPU while the host queues the whole loop (2x measured enqueue time)
                    cover_s = min(0.2, 2.0 * n * (host + 5e-6) + 1e-3)
                    torch.cuda._sleep(int(cover_s * 1.98e9))
                self.dist.all_reduce(self.syncbuf, op=self.dist.ReduceOp.MAX)  # lines the ranks up after the sleep
                starts[r].record()
                if graph_fn is not None:
                    graph_fn()
                else:
                    for _ in range(n):
                        fn()
                ends[r].record()
                if not cover:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            per = [s.elapsed_time(e) * 1e3 / n for s, e in zip(starts, ends)]
        else:
            for r in range(repeats):
                if reset:
                    reset()
                self.dist.all_reduce(self.syncbuf, op=self.dist.ReduceOp.MAX)
                h0 = time.perf_counter()
                for _ in range(n):
                    fn()
                per.append((time.perf_counter() - h0) * 1e6 / n)
        per = self.agree_max(per)
        from .timing import stats
        out = stats(per)
        out["n"] = n
        out["host_us"] = host * 1e6
        return out

    def add(self, op: str, impl: str, nbytes: int, r: dict, bw_kind: str, info: dict, extra: str = ""):
        """One CSV row; bw_kind picks the bus-bandwidth factor (nccl-tests conventions)."""
        n = self.world
        t = r["median_us"] * 1e-6
        alg = nbytes / t / GB
        factor = {"allreduce": 2 * (n - 1) / n, "gather": (n - 1) / n, "p2p": 1.0}[bw_kind]
        formula = {"allreduce": "busbw = 2(n-1)/n * bytes / t",
                   "gather": "busbw = (n-1)/n * bytes / t",
                   "p2p": "GB/s = bytes (one direction) / t"}[bw_kind]
        note = (f"algbw {alg:.2f} GB/s, busbw {alg * factor:.2f} GB/s ({formula}, n={n}); "
                f"N={r['n']} back-to-back per loop, per-repeat max over ranks, host enqueue {r['host_us']:.1f}us/call")
        if extra:
            note += "; " + extra
        if info.get("tag"):
            note += "; " + info["tag"]
        if self.rank == 0:
            self.sink.add(part="collectives", tp=n, op=op, impl=impl, dtype="bf16",
                          tokens=info.get("tokens", ""), bytes=nbytes,
                          timer="cuda_events_loop" if self.cuda else "wall_loop", note=note,
                          **{k: r[k] for k in ("median_us", "p10_us", "p90_us", "mean_us", "min_us", "repeats")})
        return alg, alg * factor


def check(ctx: Ctx, name: str, ok: bool, err: float | None = None):
    c = ctx.meta["checks"].setdefault(name, {"points": 0, "failed": 0, "max_rel_err": 0.0})
    c["points"] += 1
    if not ok:
        c["failed"] += 1
        ctx.log(f"CHECK FAILED {name} err={err}")
    if err is not None and math.isfinite(err):
        c["max_rel_err"] = max(c["max_rel_err"], err)


def rel(torch, out, ref) -> float:
    out, ref = out.double(), ref.double()
    e = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    return e if math.isfinite(e) else float("inf")


def points(ctx: Ctx, sizes: dict, need_s: float, label: str):
    for i, (b, info) in enumerate(sizes.items()):
        if ctx.stop(need_s):
            ctx.log(f"{label}: deadline near, stopped before {b} bytes ({len(sizes) - i} points left)")
            ctx.meta["skipped"][label] = len(sizes) - i
            return
        yield i, b, info

