"""Launch overhead: an empty kernel chain, and a whole Llama-style decode step eager vs CUDA graph."""
from __future__ import annotations

import time

import torch

from ..models import get_model
from . import triton_kernels as TK
from .timing import Budget, CsvSink, free_gpu, log, rand, stats


def _wall(fn, reps: int) -> list[float]:
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e6)
    return ts


def _events(fn, reps: int) -> list[float]:
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return ts


def _graph(fn, warm: int = 3) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def _add(sink, op, impl, ts, per=1, **kw):
    r = stats([t / per for t in ts])
    sink.add(part="launch", op=op, impl=impl, **kw, **r)
    return r


def empty_chain(sink: CsvSink, checks: dict, n: int = 1000) -> None:
    x = torch.ones(16, device="cuda")
    y = rand((1, 2), "cuda")
    yo = torch.empty(1, 1, device="cuda", dtype=torch.bfloat16)

    def chain():
        for _ in range(n):
            x.add_(1.0)

    def tchain():
        for _ in range(n):
            TK.silu_mul(y, yo)

    note = f"per kernel, chain of {n}"
    chain()
    tchain()
    g = _graph(chain)
    tg = _graph(tchain)
    out = {}
    out["aten_eager_wall"] = _add(sink, "empty_kernel_eager", "aten add_ on 16 floats", _wall(chain, 7), n,
                                  timer="wall", note=note)
    out["aten_eager_gpu"] = _add(sink, "empty_kernel_eager", "aten add_ on 16 floats", _events(chain, 7), n,
                                 timer="cuda_events", note=note + "; GPU span incl. launch gaps")
    out["aten_graph"] = _add(sink, "empty_kernel_graph", "aten add_ on 16 floats, graph replay",
                             _events(g.replay, 7), n, timer="cuda_events", note=note)
    out["triton_eager_wall"] = _add(sink, "empty_kernel_eager", "triton kernel (silu_mul 1x1)",
                                    _wall(tchain, 7), n, timer="wall", note=note)
    out["triton_graph"] = _add(sink, "empty_kernel_graph", "triton kernel (silu_mul 1x1), graph replay",
                               _events(tg.replay, 7), n, timer="cuda_events", note=note)
    checks["empty_chain_us_per_kernel"] = {k: round(v["median_us"], 2) for k, v in out.items()}
    log(f"launch empty chain us/kernel: {checks['empty_chain_us_per_kernel']}")
    del g, tg


class DecodeModel:
    """A Llama-style decoder (random weights) built from the same ops the dense part measures."""

    def __init__(self, model: str, batch: int, ctx: int, layers: int | None = None):
        spec = get_model(model)
        self.spec = spec
        L = layers or spec.num_layers
        h, d, ffn = spec.hidden, spec.head_dim, spec.ffn
        nh, nkv = spec.num_heads, spec.num_kv_heads
        self.nh, self.nkv, self.d, self.b, self.ctx = nh, nkv, d, batch, ctx
        dev = "cuda"
        self.w = []
        for _ in range(L):
            self.w.append(dict(
                ln1=rand((h,), dev), ln2=rand((h,), dev),
                qkv=rand(((nh + 2 * nkv) * d, h), dev, std=0.02), o=rand((h, nh * d), dev, std=0.02),
                gu=rand((2 * ffn, h), dev, std=0.02), dn=rand((h, ffn), dev, std=0.02),
                qn=rand((d,), dev)))
        self.lnf = rand((h,), dev)
        self.head = rand((spec.vocab, h), dev, std=0.02)
        self.cs = TK.make_cos_sin(max(ctx + 16, 4096), d, dev)
        nblk = -(-ctx // 16)
        nb = batch * nblk + 8
        self.kc = [rand((nb, 16, nkv, d), dev) for _ in range(L)]
        self.vc = [rand((nb, 16, nkv, d), dev) for _ in range(L)]
        self.bt = torch.randperm(nb, device=dev)[: batch * nblk].view(batch, nblk).int()
        self.sl = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
        self.pos = torch.full((batch,), ctx - 1, device=dev, dtype=torch.int64)
        last = (ctx - 1) // 16
        self.slots = (self.bt[:, last].long() * 16 + (ctx - 1) % 16)
        self.x = rand((batch, h), dev)
        self.h = torch.empty_like(self.x)
        self.res = torch.empty_like(self.x)
        self.attn = torch.empty(batch, nh, d, device=dev, dtype=torch.bfloat16)
        self.tokens = None

    def step(self):
        nh, nkv, d, b = self.nh, self.nkv, self.d, self.b
        self.h.copy_(self.x)
        self.res.zero_()
        h = self.h
        for w, kc, vc in zip(self.w, self.kc, self.vc):
            TK.rmsnorm_(h, w["ln1"], self.res)
            qkv = torch.matmul(h, w["qkv"].t())
            if self.spec.qk_norm:
                TK.head_rmsnorm_(qkv, nh + nkv, d, w["qn"])
            TK.rope_(qkv, self.pos, self.cs, nh + nkv, d)
            TK.kv_write(qkv, kc, vc, self.slots, nh, nkv, d)
            q = qkv[:, : nh * d].view(b, nh, d)
            TK.paged_decode(q, kc, vc, self.bt, self.sl, self.ctx, out=self.attn)
            h = torch.matmul(self.attn.view(b, nh * d), w["o"].t())
            TK.rmsnorm_(h, w["ln2"], self.res)
            a = TK.silu_mul(torch.matmul(h, w["gu"].t()))
            h = torch.matmul(a, w["dn"].t())
        TK.rmsnorm_(h, self.lnf, self.res)
        logits = torch.matmul(h, self.head.t())
        self.tokens = torch.argmax(logits, dim=-1)
        return self.tokens


def decode_step(sink: CsvSink, budget: Budget, checks: dict, model: str = "llama-3.1-8b",
                batches=(1, 16, 64), ctx: int = 1024, layers: int | None = None) -> None:
    res = {}
    for b in batches:
        if not budget.ok(5):
            break
        m = DecodeModel(model, b, ctx, layers)
        L = len(m.w)
        m.step()
        torch.cuda.synchronize()
        g = _graph(m.step)
        kw = dict(model=model, tp=1, batch=b, tokens=b, context=ctx, context_sum=b * ctx,
                  note=f"{L} layers + final norm + lm_head + argmax; ops from triton_kernels + cuBLAS")
        re = _add(sink, "decode_step_eager", "eager python (triton + torch.matmul)", _wall(m.step, 25),
                  timer="wall", **kw)
        rg = _add(sink, "decode_step_eager", "eager python (triton + torch.matmul)", _events(m.step, 25),
                  timer="cuda_events", **kw)
        rr = _add(sink, "decode_step_graph", "CUDA graph replay", _wall(g.replay, 15), timer="wall", **kw)
        rq = _add(sink, "decode_step_graph", "CUDA graph replay", _events(g.replay, 15),
                  timer="cuda_events", **kw)
        res[b] = {"eager_wall_us": round(re["median_us"]), "eager_events_us": round(rg["median_us"]),
                  "graph_wall_us": round(rr["median_us"]), "graph_events_us": round(rq["median_us"])}
        log(f"decode step {model} b={b} ctx={ctx}: {res[b]}")
        del g, m
        free_gpu()
    checks["decode_step"] = res


def launch(sink: CsvSink, budget: Budget, checks: dict, small: bool = False) -> None:
    empty_chain(sink, checks, n=100 if small else 1000)
    decode_step(sink, budget, checks, layers=2 if small else None,
                batches=(1,) if small else (1, 16, 64, 256))
