"""The measured parts of `simserve.calibrate.collectives`, one function per collective: the size
grids, then all-reduce, all-to-all, all-gather / reduce-scatter, point-to-point copies and
all-reduce under CUDA graph capture. Each part checks one result against an expectation
rebuilt from every rank's seeded input, then times each size with `Ctx.loop_time`, and stops
(on every rank at once) when fewer than `reserve_s` seconds remain for the parts after it.
"""
from __future__ import annotations

import traceback

from .collective_timer import GB, Ctx, check, points, rel

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



def part_allreduce(ctx: Ctx, sizes: dict, reserve_s: float, second: bool = False):
    torch, dist, R, W = ctx.torch, ctx.dist, ctx.rank, ctx.world
    label = "allreduce_second_pass" if second else "allreduce"
    for i, b, info in points(ctx, sizes, reserve_s, label):
        n = b // 2
        ins = [ctx.randn(n, 1000 + 10 * i + r) for r in range(W)]
        ref = ins[0].float()
        for x in ins[1:]:
            ref = ref + x.float()
        buf = ins[R].clone()
        dist.all_reduce(buf)
        e = rel(torch, buf, ref.to(torch.bfloat16))
        check(ctx, label, e < 1e-2, e)
        pristine = ins[R]
        del ins, ref
        r = ctx.loop_time(lambda: dist.all_reduce(buf), reset=lambda: buf.copy_(pristine))
        impl = "nccl all_reduce sum (eager" + (", second pass: repeatability)" if second else ")")
        alg, bus = ctx.add("allreduce", impl, b, r, "allreduce", info, f"check rel err {e:.1e}")
        ctx.log(f"allreduce {b:>11} B  {r['median_us']:9.1f} us  busbw {bus:7.1f} GB/s  N={r['n']}")


def part_alltoall(ctx: Ctx, sizes: list[int], reserve_s: float):
    torch, dist, R, W = ctx.torch, ctx.dist, ctx.rank, ctx.world
    for i, b, info in points(ctx, {s: {} for s in sizes}, reserve_s, "alltoall"):
        n = b // 2
        ins = [ctx.randn(n, 2000 + 10 * i + r) for r in range(W)]
        out = torch.full((n,), float("nan"), device=ctx.device, dtype=torch.bfloat16)
        x = ins[R]
        dist.all_to_all_single(out, x)
        c = n // W
        ref = torch.cat([ins[j][R * c:(R + 1) * c] for j in range(W)])
        ok = bool(torch.equal(out, ref))
        check(ctx, "alltoall", ok, 0.0 if ok else rel(torch, out, ref))
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
    for i, b, info in points(ctx, sizes, reserve_s, which):
        n = b // 2  # bytes = the full (gathered / pre-scatter) tensor, as nccl-tests counts it
        c = n // W
        if which == "allgather":
            ins = [ctx.randn(c, 3000 + 10 * i + r) for r in range(W)]
            x = ins[R]
            out = torch.full((n,), float("nan"), device=ctx.device, dtype=torch.bfloat16)
            _allgather(ctx, out, x)
            ok = bool(torch.equal(out, torch.cat(ins)))
            check(ctx, "allgather", ok)
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
            e = rel(torch, out, ref[R * c:(R + 1) * c].to(torch.bfloat16))
            check(ctx, "reducescatter", e < 1e-2, e)
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
        check(ctx, "p2p_copy", ok)
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
    check(ctx, "p2p_sendrecv", ok)

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

    for i, b, info in points(ctx, {s: {} for s in sizes}, reserve_s, "p2p"):
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
    for i, b, info in points(ctx, sizes, reserve_s, "graph"):
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
            e = rel(torch, buf, ref)
            check(ctx, "allreduce_graph", e < 5e-2, e)
            del ref
            r = ctx.loop_time(gr.replay, reset=lambda: buf.copy_(pristine), nmin=nloop, nmax=nloop,
                              warmup=1, graph_fn=gr.replay)
            ctx.add("allreduce", f"nccl all_reduce sum, CUDA graph of {nloop} captured calls", b, r,
                    "allreduce", info, f"check rel err {e:.1e}; replay time / {nloop}")
            ctx.log(f"graph {b:>9} B  graph {r['median_us']:7.2f} us/op  eager(no cover) {eager_nc:7.2f} us/op")

