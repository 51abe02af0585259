"""Collectives between GPUs of one host (NCCL): all-reduce, all-to-all, all-gather, reduce-scatter,
point-to-point copies, and all-reduce under CUDA graph capture. One process per GPU.

    torchrun --nproc_per_node=2 -m simserve.calibrate.collectives --out DIR [--total-s 240]
    python3 -m torch.distributed.run --nproc_per_node=2 -m simserve.calibrate.collectives --out DIR
    python3 -m simserve.calibrate.collectives --out DIR --nproc 2     (spawns its own processes)
    python3 -m simserve.calibrate.collectives --out DIR --nproc 2 --backend gloo --smoke   (CPU test)

Method: per point, one correctness check against an expectation computed from every rank's
(regenerated) input, a warm-up, then `repeats` timed loops of N back-to-back collectives
(CUDA events around the loop on every rank; a GPU sleep ahead of the loop covers the host's
enqueue time and a 1-element all-reduce lines the ranks up; no barrier inside the loop).
Per repeat: loop time / N, max over ranks; the row holds the stats over repeats.
Writes collectives.csv (timing.COLUMNS schema, rank 0 only, flushed per row) and meta.json.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends are forced below).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback

# Keep NVLink multicast off whatever the caller's environment says (shared hosts forbid it).
_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(_SAFE_ENV)

GB = 1e9
HIDDENS = (4096, 5120, 8192)
TP_TOKENS = (1, 16, 128, 512, 2048, 8192)


def pow2(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def reduce_sizes(lo: int, hi: int, with_tp: bool = True) -> dict[int, dict]:
    """Powers of 2 plus the per-layer TP activation sizes T*hidden*2 (bf16)."""
    sizes = {s: {"tag": "", "tokens": ""} for s in pow2(lo, hi)}
    if with_tp:
        for h in HIDDENS:
            for t in TP_TOKENS:
                b = t * h * 2
                if lo <= b <= hi:
                    d = sizes.setdefault(b, {"tag": "", "tokens": ""})
                    d["tag"] = (d["tag"] + f"; tp-layer hidden={h} T={t}").strip("; ")
                    if d["tokens"] == "":
                        d["tokens"] = t
    return dict(sorted(sizes.items()))


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


def _check(ctx: Ctx, name: str, ok: bool, err: float | None = None):
    c = ctx.meta["checks"].setdefault(name, {"points": 0, "failed": 0, "max_rel_err": 0.0})
    c["points"] += 1
    if not ok:
        c["failed"] += 1
        ctx.log(f"CHECK FAILED {name} err={err}")
    if err is not None and math.isfinite(err):
        c["max_rel_err"] = max(c["max_rel_err"], err)


def _rel(torch, out, ref) -> float:
    out, ref = out.double(), ref.double()
    e = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    return e if math.isfinite(e) else float("inf")


def _points(ctx: Ctx, sizes: dict, need_s: float, label: str):
    for i, (b, info) in enumerate(sizes.items()):
        if ctx.stop(need_s):
            ctx.log(f"{label}: deadline near, stopped before {b} bytes ({len(sizes) - i} points left)")
            ctx.meta["skipped"][label] = len(sizes) - i
            return
        yield i, b, info


# ------------------------------------------------------------------------------------------------
def part_allreduce(ctx: Ctx, sizes: dict, reserve_s: float, second: bool = False):
    torch, dist, R, W = ctx.torch, ctx.dist, ctx.rank, ctx.world
    label = "allreduce_second_pass" if second else "allreduce"
    for i, b, info in _points(ctx, sizes, reserve_s, label):
        n = b // 2
        ins = [ctx.randn(n, 1000 + 10 * i + r) for r in range(W)]
        ref = ins[0].float()
        for x in ins[1:]:
            ref = ref + x.float()
        buf = ins[R].clone()
        dist.all_reduce(buf)
        e = _rel(torch, buf, ref.to(torch.bfloat16))
        _check(ctx, label, e < 1e-2, e)
        pristine = ins[R]
        del ins, ref
        r = ctx.loop_time(lambda: dist.all_reduce(buf), reset=lambda: buf.copy_(pristine))
        impl = "nccl all_reduce sum (eager" + (", second pass: repeatability)" if second else ")")
        alg, bus = ctx.add("allreduce", impl, b, r, "allreduce", info, f"check rel err {e:.1e}")
        ctx.log(f"allreduce {b:>11} B  {r['median_us']:9.1f} us  busbw {bus:7.1f} GB/s  N={r['n']}")


def part_alltoall(ctx: Ctx, sizes: list[int], reserve_s: float):
    torch, dist, R, W = ctx.torch, ctx.dist, ctx.rank, ctx.world
    for i, b, info in _points(ctx, {s: {} for s in sizes}, reserve_s, "alltoall"):
        n = b // 2
        ins = [ctx.randn(n, 2000 + 10 * i + r) for r in range(W)]
        out = torch.full((n,), float("nan"), device=ctx.device, dtype=torch.bfloat16)
        x = ins[R]
        dist.all_to_all_single(out, x)
        c = n // W
        ref = torch.cat([ins[j][R * c:(R + 1) * c] for j in range(W)])
        ok = bool(torch.equal(out, ref))
        _check(ctx, "alltoall", ok, 0.0 if ok else _rel(torch, out, ref))
        del ins, ref
        r = ctx.loop_time(lambda: dist.all_to_all_single(out, x))
        alg, bus = ctx.add("alltoall", "nccl all_to_all_single, equal splits", b, r, "gather", info,
                           "bytes = total input per rank")
        ctx.log(f"alltoall  {b:>11} B  {r['median_us']:9.1f} us  busbw {bus:7.1f} GB/s  N={r['n']}")


def _allgather(ctx, out, x):
    if ctx.args.backend == "gloo":  # gloo lacks the tensor form on some builds: emulate (CPU test only)
        ctx.dist.all_gather(list(out.chunk(ctx.world)), x)
    else:
        ctx.dist.all_gather_into_tensor(out, x)


def _reducescatter(ctx, out, x):
    if ctx.args.backend == "gloo":  # CPU test only
        y = x.clone()
        ctx.dist.all_reduce(y)
        out.copy_(y.chunk(ctx.world)[ctx.rank])
    else:
        ctx.dist.reduce_scatter_tensor(out, x)


def part_gather_scatter(ctx: Ctx, sizes: dict, reserve_s: float, which: str):
    torch, R, W = ctx.torch, ctx.rank, ctx.world
    for i, b, info in _points(ctx, sizes, reserve_s, which):
        n = b // 2  # bytes = the full (gathered / pre-scatter) tensor, as nccl-tests counts it
        c = n // W
        if which == "allgather":
            ins = [ctx.randn(c, 3000 + 10 * i + r) for r in range(W)]
            x = ins[R]
            out = torch.full((n,), float("nan"), device=ctx.device, dtype=torch.bfloat16)
            _allgather(ctx, out, x)
            ok = bool(torch.equal(out, torch.cat(ins)))
            _check(ctx, "allgather", ok)
            fn = lambda: _allgather(ctx, out, x)  # noqa: E731
            impl, extra = "nccl all_gather_into_tensor", "bytes = gathered output per rank"
        else:
            ins = [ctx.randn(n, 4000 + 10 * i + r) for r in range(W)]
            x = ins[R]
            out = torch.full((c,), float("nan"), device=ctx.device, dtype=torch.bfloat16)
            _reducescatter(ctx, out, x)
            ref = ins[0].float()
            for y in ins[1:]:
                ref = ref + y.float()
            e = _rel(torch, out, ref[R * c:(R + 1) * c].to(torch.bfloat16))
            _check(ctx, "reducescatter", e < 1e-2, e)
            del ref
            fn = lambda: _reducescatter(ctx, out, x)  # noqa: E731
            impl, extra = "nccl reduce_scatter_tensor sum", "bytes = input per rank (before scatter)"
        del ins
        r = ctx.loop_time(fn)
        alg, bus = ctx.add(which, impl, b, r, "gather", info, extra)
        ctx.log(f"{which:<9} {b:>11} B  {r['median_us']:9.1f} us  busbw {bus:7.1f} GB/s  N={r['n']}")


def part_p2p(ctx: Ctx, sizes: list[int], reserve_s: float):
    """GPU0->GPU1 copies: tensor.copy_ across devices (each process writes into a buffer it holds on
    the peer GPU) and NCCL send/recv; one direction (rank 0 sends) and both at once."""
    torch, dist, R, W = ctx.torch, ctx.dist, ctx.rank, ctx.world
    peer = (R + 1) % W
    maxb = max(sizes)
    do_copy = ctx.cuda and W == 2
    if do_copy:
        src = torch.randint(1, 255, (maxb,), dtype=torch.uint8, device=ctx.device)
        dst = torch.empty(maxb, dtype=torch.uint8, device=f"cuda:{peer}")
        # check: a 1 MiB copy arrives intact
        m = 1 << 20
        dst[:m].copy_(src[:m])
        torch.cuda.synchronize(peer)
        ok = bool(torch.equal(dst[:m].to(ctx.device), src[:m]))
        _check(ctx, "p2p_copy", ok)
        ctx.meta["p2p"][f"rank{R}_can_access_peer"] = torch.cuda.can_device_access_peer(R, peer)
    sbuf = torch.randint(1, 255, (maxb,), dtype=torch.uint8, device=ctx.device)
    rbuf = torch.zeros(maxb, dtype=torch.uint8, device=ctx.device)
    # check NCCL send/recv at 1 MiB both ways
    m = min(1 << 20, maxb)
    ops = [dist.P2POp(dist.isend, sbuf[:m], peer), dist.P2POp(dist.irecv, rbuf[:m], peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    # the peer's sbuf is not rebuildable from a seed (randint on the global RNG): compare sums
    hs = torch.tensor([float(sbuf[:m].double().sum().item()), float(rbuf[:m].double().sum().item())],
                      device=ctx.device, dtype=torch.float64)
    allh = [torch.zeros_like(hs) for _ in range(W)]
    dist.all_gather(allh, hs)
    ok = bool(allh[peer][0].item() == hs[1].item())
    _check(ctx, "p2p_sendrecv", ok)

    def send_one(s):
        if R == 0:
            dist.send(sbuf[:s], 1)
        elif R == 1:
            dist.recv(rbuf[:s], 0)

    def send_both(s):
        ops = [dist.P2POp(dist.isend, sbuf[:s], peer), dist.P2POp(dist.irecv, rbuf[:s], peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()  # NCCL: only makes the current stream wait (host does not block)

    def copy_one(s):
        if R == 0:
            dst[:s].copy_(src[:s], non_blocking=True)

    def copy_both(s):
        dst[:s].copy_(src[:s], non_blocking=True)

    for i, b, info in _points(ctx, {s: {} for s in sizes}, reserve_s, "p2p"):
        modes = []
        if do_copy:
            modes += [("p2p_copy", "tensor.copy_ cuda:0->cuda:1", copy_one, 1),
                      ("p2p_copy_bidir", "tensor.copy_ both ways at once (one process each)", copy_both, 2)]
        modes += [("p2p_copy", "nccl send/recv rank0->rank1", send_one, 1),
                  ("p2p_copy_bidir", "nccl batch_isend_irecv both ways", send_both, 2)]
        line = []
        for op, impl, f, dirs in modes:
            r = ctx.loop_time(lambda: f(b), target_ms=5.0, nmax=50, repeats=5)
            extra = "one direction" if dirs == 1 else \
                f"both directions at once; per direction; aggregate {2 * b / (r['median_us'] * 1e-6) / GB:.1f} GB/s"
            alg, _ = ctx.add(op, impl, b, r, "p2p", info, extra)
            line.append(f"{op}/{impl.split()[0]} {alg:6.1f}")
        ctx.log(f"p2p {b:>11} B  GB/s per direction: " + ", ".join(line))
    if do_copy:
        del src, dst


def part_graph(ctx: Ctx, sizes: dict, reserve_s: float, nloop: int = 50):
    """Small all-reduce: CUDA-graph replay of N captured all-reduces vs eager without the GPU sleep
    (the host-bound rate a Python eager loop really reaches). Eager-with-cover is the allreduce part."""
    torch, dist, R, W = ctx.torch, ctx.dist, ctx.rank, ctx.world
    for i, b, info in _points(ctx, sizes, reserve_s, "graph"):
        n = b // 2
        pristine = ctx.randn(n, 5000 + 10 * i + R)
        buf = pristine.clone()
        r = ctx.loop_time(lambda: dist.all_reduce(buf), reset=lambda: buf.copy_(pristine), cover=False,
                          nmin=nloop, nmax=nloop)
        ctx.add("allreduce", "nccl all_reduce sum (eager, host-bound: no GPU sleep cover)", b, r,
                "allreduce", info, "GPU span of a Python loop incl. launch gaps")
        eager_nc = r["median_us"]
        gr = None
        ok_flag = 1.0
        if ctx.cuda:
            try:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        dist.all_reduce(buf)
                torch.cuda.current_stream().wait_stream(s)
                torch.cuda.synchronize()
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr, capture_error_mode="thread_local"):
                    for _ in range(nloop):
                        dist.all_reduce(buf)
                torch.cuda.synchronize()
            except Exception as ex:  # noqa: BLE001
                ok_flag = 0.0
                ctx.meta["graph_error"] = f"{type(ex).__name__}: {ex}"[:500]
                traceback.print_exc()
        if ctx.agree_max([1.0 - ok_flag])[0] > 0:
            ctx.log("graph: capture failed on some rank; graph points skipped")
            return
        if gr is not None:
            # check: one replay from known inputs = 2^(nloop-1)-scaled sum for 2 ranks
            buf.copy_(pristine)
            gr.replay()
            torch.cuda.synchronize()
            ref = ctx.randn(n, 5000 + 10 * i + 0).float()
            for j in range(1, W):
                ref = ref + ctx.randn(n, 5000 + 10 * i + j).float()
            ref = ref * float(W) ** (nloop - 1)
            e = _rel(torch, buf, ref)
            _check(ctx, "allreduce_graph", e < 5e-2, e)
            del ref
            r = ctx.loop_time(gr.replay, reset=lambda: buf.copy_(pristine), nmin=nloop, nmax=nloop,
                              warmup=1, graph_fn=gr.replay)
            ctx.add("allreduce", f"nccl all_reduce sum, CUDA graph of {nloop} captured calls", b, r,
                    "allreduce", info, f"check rel err {e:.1e}; replay time / {nloop}")
            ctx.log(f"graph {b:>9} B  graph {r['median_us']:7.2f} us/op  eager(no cover) {eager_nc:7.2f} us/op")


# ------------------------------------------------------------------------------------------------
def _sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as ex:  # noqa: BLE001
        return f"failed: {ex}"


def worker(rank: int, world: int, args) -> int:
    import torch
    import torch.distributed as dist

    from .timing import CsvSink, log

    cuda = args.backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
    else:
        device = "cpu"
    t_start = time.monotonic()
    deadline = t_start + args.total_s
    kw = {"device_id": torch.device(device)} if cuda else {}
    dist.init_process_group(args.backend, rank=rank, world_size=world, **kw)
    sink = None
    meta = {"checks": {}, "skipped": {}, "p2p": {}, "parts": {}}
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        sink = CsvSink(os.path.join(args.out, "collectives.csv"))
        from .run_all import env_info
        env = env_info(torch)
        env["command"] = os.environ.get("CAL_CMDLINE") or " ".join(
            [sys.executable, "-m", "simserve.calibrate.collectives", *sys.argv[1:]])
        env["launcher"] = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "torch.multiprocessing.spawn"
        env["world_size"] = world
        env["backend"] = args.backend
        env["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
        env["env_vars"] = {k: v for k, v in sorted(os.environ.items())
                           if k.startswith(("NCCL_", "TORCH_NCCL", "TORCH_SYMM", "NVSHMEM_", "CUDA_"))}
        if cuda:
            env["nvidia_smi_topo"] = _sh("nvidia-smi topo -m")
            env["nvidia_smi_nvlink_status"] = _sh("nvidia-smi nvlink --status")
            env["nvidia_smi_list"] = _sh("nvidia-smi -L")
            env["device_count"] = torch.cuda.device_count()
            env["can_access_peer"] = {f"{i}->{j}": torch.cuda.can_device_access_peer(i, j)
                                      for i in range(torch.cuda.device_count())
                                      for j in range(torch.cuda.device_count()) if i != j}
        meta["env"] = env
        meta["method"] = __doc__
    torch.manual_seed(1234 + rank)

    def write_meta():
        if rank == 0:
            meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
            meta["rows"] = sink.count
            with open(os.path.join(args.out, "meta.json"), "w") as f:
                json.dump(meta, f, indent=1, default=str)

    write_meta()
    if rank == 0:
        log("env:", json.dumps({k: meta["env"].get(k) for k in (
            "torch", "torch_cuda", "nccl_version", "gpu", "device_count", "can_access_peer", "env_vars",
            "launcher")}, default=str))
        if cuda:
            print(meta["env"]["nvidia_smi_topo"], flush=True)
    ctx = Ctx(torch, dist, rank, world, device, cuda, sink, meta, deadline, args)
    sm = args.smoke
    mx = args.max_bytes
    red = reduce_sizes(2048, mx, with_tp=True)
    coarse = reduce_sizes(2048, mx, with_tp=not sm)
    if args.coarse:
        coarse = {b: v for b, v in coarse.items() if b in set(pow2(2048, mx)[::2]) or v["tag"]}
    a2a = pow2(4096, mx)
    p2p = pow2(4096, args.p2p_max_bytes)
    small = {b: v for b, v in red.items() if b <= (1 << 20)}
    # each part stops early if less than `reserve` seconds remain for the parts after it
    plan = [("allreduce", lambda r: part_allreduce(ctx, red, r), 130),
            ("alltoall", lambda r: part_alltoall(ctx, a2a, r), 100),
            ("p2p", lambda r: part_p2p(ctx, p2p, r), 60),
            ("allgather", lambda r: part_gather_scatter(ctx, coarse, r, "allgather"), 45),
            ("reducescatter", lambda r: part_gather_scatter(ctx, coarse, r, "reducescatter"), 30),
            ("graph", lambda r: part_graph(ctx, small, r), 15),
            ("allreduce2", lambda r: part_allreduce(ctx, red, r, second=True), 3)]
    if args.parts:
        keep = args.parts.split(",")
        plan = [p for p in plan if p[0] in keep]
    scale = args.total_s / 300.0
    for name, fn, reserve in plan:
        t0 = time.monotonic()
        ctx.log(f"=== {name} (stops when < {reserve * scale:.0f}s remain) ===")
        status = "ok"
        try:
            fn(reserve * scale)
        except Exception as ex:  # noqa: BLE001
            traceback.print_exc()
            status = f"failed: {type(ex).__name__}: {ex}"[:500]
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        meta["parts"][name] = {"status": status, "used_s": round(time.monotonic() - t0, 1)}
        ctx.log(f"=== {name}: {status}, {time.monotonic() - t0:.1f}s ===")
        write_meta()
    write_meta()
    if rank == 0:
        log("rows:", sink.count, "checks:", json.dumps(meta["checks"]))
        sink.close()
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 0


def _spawned(rank, world, args):
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    os.environ["LOCAL_RANK"] = str(rank)
    worker(rank, world, args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"], help="gloo = CPU test")
    ap.add_argument("--total-s", type=float, default=240.0, help="deadline from start, seconds")
    ap.add_argument("--max-bytes", type=int, default=512 << 20)
    ap.add_argument("--p2p-max-bytes", type=int, default=1 << 30)
    ap.add_argument("--nproc", type=int, default=2, help="processes to spawn when not under torchrun")
    ap.add_argument("--parts", default="", help="comma list to restrict (default all)")
    ap.add_argument("--coarse", action="store_true", help="every other power of 2 for gather/scatter")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        return worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    mp.spawn(_spawned, args=(args.nproc, args), nprocs=args.nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
