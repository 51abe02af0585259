"""GPU parts: ceilings, dense linear ops, per-layer elementwise ops, prefill and decode attention.

Shapes come from `simserve.models` (per-rank under TP). Each point is one CSV row.
"""
from __future__ import annotations

import math
from itertools import accumulate

import torch
import torch.nn.functional as F

from ..models import get_model
from . import triton_kernels as TK
from .timing import Budget, CsvSink, bench, fmt_row, free_gpu, log, rand, rel_err

TOKENS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
          3072, 4096, 6144, 8192, 12288, 16384]
ROT_BYTES = 256 << 20  # rotate inputs over > 4x the 60 MB L2
BF16 = torch.bfloat16


def _clamp(v, lo, hi):
    return max(lo, min(hi, v))


# ------------------------------------------------------------------------------------------
def ceilings(sink: CsvSink, device: str, checks: dict, small: bool = False) -> None:
    """The two roofline ceilings on this card: a large D2D copy and an 8192^3 bf16 matmul."""
    n = (1 << 26) if small else (1 << 31)  # elements of bf16: 4 GiB
    a = torch.empty(n, device=device, dtype=BF16).uniform_(-1, 1)
    b = torch.empty_like(a)
    r = bench(lambda i: b.copy_(a), device, min_reps=5, max_reps=20)
    sink.add(part="ceiling", op="d2d_copy", impl="tensor.copy_", dtype="bf16", bytes=2 * n * 2, **r)
    log("ceiling d2d copy", f"{2 * n * 2 / r['median_us'] / 1e3:.0f} GB/s", fmt_row(r))
    checks["ceiling_d2d_GBps"] = 2 * n * 2 / r["median_us"] / 1e3
    del a, b
    m = 1024 if small else 8192
    x = rand((m, m), device)
    w = rand((m, m), device)
    out = torch.empty(m, m, device=device, dtype=BF16)
    r = bench(lambda i: torch.matmul(x, w.t(), out=out), device, min_reps=10, max_reps=50)
    sink.add(part="ceiling", op="matmul_square", impl="torch.matmul(x, W.T)", dtype="bf16",
             tokens=m, k=m, n=m, flops=2 * m ** 3, bytes=3 * m * m * 2, **r)
    log("ceiling matmul", f"{2 * m ** 3 / r['median_us'] / 1e6:.0f} TFLOP/s", fmt_row(r))
    checks["ceiling_matmul_TFLOPs"] = 2 * m ** 3 / r["median_us"] / 1e6
    free_gpu()


# ------------------------------------------------------------------------------------------
def dense(sink: CsvSink, budget: Budget, device: str, configs, tokens, checks: dict,
          elementwise_ops: bool = True, lm_head: bool = True) -> None:
    """Per-rank linear ops (qkv, o, gate_up, down, lm_head) and the elementwise ops."""
    tmax = max(tokens)
    for mname, tp in configs:
        spec = get_model(mname)
        gemms = list(spec.gemms(tp)) + ([spec.lm_head(tp)] if lm_head else [])
        log(f"dense {mname} tp{tp}: " + ", ".join(f"{g.name} {g.k}x{g.n}" for g in gemms))
        for g in gemms:
            if not budget.ok():
                log("dense: budget spent")
                return
            nw = _clamp(math.ceil(ROT_BYTES / (g.k * g.n * 2)), 1, 16)
            ws = [rand((g.n, g.k), device, std=0.02) for _ in range(nw)]  # nn.Linear layout [N, K]
            xpool = rand((tmax, g.k), device)
            out = torch.empty(tmax, g.n, device=device, dtype=BF16)
            key = f"gemm_{g.name}_{g.k}x{g.n}"
            if key not in checks:
                xs = xpool[:64]
                torch.matmul(xs, ws[0].t(), out=out[:64])
                checks[key] = rel_err(out[:64], xs.double() @ ws[0].double().t())
            for t in tokens:
                if not budget.ok():
                    break
                nx = max(1, tmax // t)

                def fn(i, t=t, nx=nx, nw=nw):
                    j = (i % nx) * t
                    torch.matmul(xpool[j:j + t], ws[i % nw].t(), out=out[:t])

                r = bench(fn, device)
                sink.add(part="gpu_dense", model=mname, tp=tp, op=g.name,
                         impl="torch.matmul(x, W.T) [W stored NxK]", dtype="bf16", tokens=t,
                         k=g.k, n=g.n, flops=2.0 * t * g.k * g.n,
                         bytes=(t * g.k + g.k * g.n + t * g.n) * 2, **r)
            log(f"  {g.name}: T=1 .. T={tokens[-1]} done, check {checks[key]:.2e}, "
                f"budget left {budget.left():.0f}s")
            del ws, xpool, out
            free_gpu()
        if elementwise_ops:
            elementwise(sink, budget, device, spec, tp, tokens, checks)


def elementwise(sink: CsvSink, budget: Budget, device: str, spec, tp: int, tokens,
                checks: dict) -> None:
    tmax = max(tokens)
    h, d = spec.hidden, spec.head_dim
    nh, nkv = spec.heads_per_rank(tp)
    qkv_n = (nh + 2 * nkv) * d
    ffn = spec.ffn // tp
    impl = "triton (simserve.calibrate.triton_kernels)"
    xpool = rand((tmax, h), device)
    rpool = rand((tmax, h), device)
    wn = rand((h,), device)
    qkvpool = rand((tmax, qkv_n), device)
    gpool = rand((tmax, 2 * ffn), device)
    gout = torch.empty(tmax, ffn, device=device, dtype=BF16)
    cs = TK.make_cos_sin(32768, d, device)
    pos = torch.randint(0, 32768, (tmax,), device=device)
    wq = rand((d,), device)
    nb = 2 * tmax // 16
    kc = rand((nb, 16, nkv, d), device)
    vc = rand((nb, 16, nkv, d), device)
    slots = torch.randperm(nb * 16, device=device)[:tmax].to(torch.int64)

    # correctness on a small case
    ck = f"elementwise_{spec.name}_tp{tp}"
    if ck not in checks:
        c = {}
        x, r0 = xpool[:8].clone(), rpool[:8].clone()
        z = x.float() + r0.float()
        ref = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6) * wn.float()
        TK.rmsnorm_(x, wn, r0)
        c["rmsnorm_add"] = rel_err(x, ref)
        q = qkvpool[:8].clone()
        ref = TK.rope_ref(q, pos[:8], cs, nh + nkv, d)
        TK.rope_(q, pos[:8], cs, nh + nkv, d)
        c["rope"] = rel_err(q[:, : (nh + nkv) * d], ref)
        gg = gpool[:8]
        c["silu_mul"] = rel_err(TK.silu_mul(gg), F.silu(gg[:, :ffn].float()) * gg[:, ffn:].float())
        q = qkvpool[:8].clone()
        kc2, vc2 = kc.clone(), vc.clone()
        TK.kv_write(q, kc2, vc2, slots[:8], nh, nkv, d)
        c["kv_write"] = rel_err(kc2.view(-1, nkv, d)[slots[:8]],
                                q[:, nh * d:(nh + nkv) * d].reshape(8, nkv, d))
        del kc2, vc2
        if spec.qk_norm:
            q = qkvpool[:8].clone()
            v = q[:, : (nh + nkv) * d].float().view(8, nh + nkv, d)
            ref = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * wq.float()
            TK.head_rmsnorm_(q, nh + nkv, d, wq)
            c["qk_norm"] = rel_err(q[:, : (nh + nkv) * d], ref.view(8, -1))
        checks[ck] = c
        log(f"  elementwise checks {c}")

    ops = {
        "rmsnorm_add": (lambda i, t, j: TK.rmsnorm_(xpool[j:j + t], wn, rpool[j:j + t]),
                        lambda t: 8 * t * h, dict(k=h)),
        "rope": (lambda i, t, j: TK.rope_(qkvpool[j:j + t], pos[j:j + t], cs, nh + nkv, d),
                 lambda t: 4 * t * (nh + nkv) * d + t * (8 + 2 * d), dict(heads=nh, kv_heads=nkv, head_dim=d)),
        "silu_mul": (lambda i, t, j: TK.silu_mul(gpool[j:j + t], gout[j:j + t]),
                     lambda t: 6 * t * ffn, dict(n=ffn)),
        "kv_write": (lambda i, t, j: TK.kv_write(qkvpool[j:j + t], kc, vc, slots[j:j + t], nh, nkv, d),
                     lambda t: 8 * t * nkv * d + 8 * t, dict(kv_heads=nkv, head_dim=d)),
    }
    if spec.qk_norm:
        ops["qk_norm"] = (lambda i, t, j: TK.head_rmsnorm_(qkvpool[j:j + t], nh + nkv, d, wq),
                          lambda t: 4 * t * (nh + nkv) * d, dict(heads=nh, kv_heads=nkv, head_dim=d))
    _bench_elementwise(sink, budget, device, spec, tp, tokens, impl, ops)
    log(f"  elementwise {spec.name} tp{tp} done, budget left {budget.left():.0f}s")
    del xpool, rpool, qkvpool, gpool, gout, kc, vc
    free_gpu()


def _bench_elementwise(sink: CsvSink, budget: Budget, device: str, spec, tp: int, tokens,
                       impl: str, ops: dict) -> None:
    """One row per (op, token count); `ops` maps a name to (call(i, t, offset), bytes(t), extra
    columns). Inputs rotate over the pools' `max(tokens)` rows."""
    tmax = max(tokens)
    for name, (f, nbytes, extra) in ops.items():
        for t in tokens:
            if not budget.ok():
                log("elementwise: budget spent")
                break
            nx = max(1, tmax // t)

            def fn(i, t=t, nx=nx, f=f):
                f(i, t, (i % nx) * t)

            r = bench(fn, device)
            sink.add(part="gpu_elementwise", model=spec.name, tp=tp, op=name, impl=impl,
                     dtype="bf16", tokens=t, bytes=nbytes(t), **extra, **r)


# ------------------------------------------------------------------------------------------
def _flash(q, k, v, scale):
    """Causal flash attention; for q shorter than k the mask is bottom-right aligned (FA2)."""
    if q.device.type == "cuda":
        return torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=scale)[0]
    from torch.nn.attention.bias import causal_lower_right
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
                                          scale=scale, enable_gqa=True)


def _attn_ref(q, k, v, scale):
    """float64 reference, q [1,H,Lq,D], k/v [1,KVH,Lk,D], bottom-right causal."""
    g = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    lq, lk = q.shape[2], k.shape[2]
    s = (qd @ kd.transpose(-1, -2)) * scale
    mask = torch.arange(lk, device=q.device)[None, :] <= (torch.arange(lq, device=q.device)[:, None] + lk - lq)
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ vd


def prefill(sink: CsvSink, budget: Budget, device: str, model: str, tps, chunks, contexts,
            checks: dict) -> None:
    spec = get_model(model)
    d = spec.head_dim
    scale = d ** -0.5
    for tp in tps:
        nh, nkv = spec.heads_per_rank(tp)
        # GQA: pass K/V with fewer heads straight to the flash kernel when it accepts them.
        q = rand((1, 80, nh, d), device).transpose(1, 2)
        k = rand((1, 180, nkv, d), device).transpose(1, 2)
        v = rand((1, 180, nkv, d), device).transpose(1, 2)
        ref = _attn_ref(q, k, v, scale)
        try:
            e = rel_err(_flash(q, k, v, scale), ref)
            gqa = "native"
        except Exception as ex:  # noqa: BLE001
            log(f"prefill: native GQA failed ({ex}); expanding K/V")
            e = float("inf")
            gqa = "expanded"
        if gqa == "native" and not e < 2e-2:
            gqa = "expanded"
        if gqa == "expanded":
            g = nh // nkv
            e = rel_err(_flash(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), scale), ref)
        checks[f"prefill_{model}_tp{tp}"] = {"rel_err": e, "gqa": gqa}
        log(f"prefill {model} tp{tp}: heads {nh}/{nkv}, gqa {gqa}, check {e:.2e}")
        impl = ("aten._scaled_dot_product_flash_attention (FA2, causal bottom-right), GQA "
                + ("native (K/V with kv heads)" if gqa == "native" else "by expanded K/V"))
        for chunk in chunks:
            for ctx in contexts:
                if not budget.ok():
                    log("prefill: budget spent")
                    return
                lk = ctx + chunk
                kvh = nkv if gqa == "native" else nh
                one = (2 * chunk * nh + 2 * lk * kvh) * d * 2
                ns = _clamp(math.ceil(ROT_BYTES / one), 1, 8)
                qs = [rand((1, chunk, nh, d), device).transpose(1, 2) for _ in range(ns)]
                ks = [rand((1, lk, kvh, d), device).transpose(1, 2) for _ in range(ns)]
                vs = [rand((1, lk, kvh, d), device).transpose(1, 2) for _ in range(ns)]
                r = bench(lambda i: _flash(qs[i % ns], ks[i % ns], vs[i % ns], scale), device,
                          min_reps=10)
                work = chunk * (ctx + (chunk + 1) / 2)
                sink.add(part="gpu_prefill_attn", model=model, tp=tp, op="prefill_attn",
                         impl=impl, dtype="bf16", tokens=chunk, batch=1, chunk=chunk, context=ctx,
                         context_sum=ctx, heads=nh, kv_heads=nkv, head_dim=d,
                         flops=spec.prefill_attn_flops_per_layer(work, tp),
                         bytes=(2 * chunk * nh + 2 * lk * nkv) * d * 2,
                         note=f"work_tokens2={work:.6g}", **r)
                del qs, ks, vs
        log(f"prefill tp{tp} done, budget left {budget.left():.0f}s")
        free_gpu()


def mixed_varlen(sink: CsvSink, budget: Budget, device: str, model: str, checks: dict,
                 prefills=(512, 2048), decodes=(8, 32, 128), dctx=(1024, 8192)) -> None:
    """One varlen flash call over [prefill chunk + N decodes] vs the two parts called alone."""
    if device != "cuda":
        return
    spec = get_model(model)
    d = spec.head_dim
    nh, nkv = spec.heads_per_rank(1)
    scale = d ** -0.5
    fa = torch.ops.aten._flash_attention_forward

    def call(q, k, v, cq, ck, mq, mk):
        return fa(q, k, v, cq, ck, mq, mk, 0.0, True, False, scale=scale)[0]

    # check: varlen with two sequences vs reference
    lq, lk = [40, 1], [100, 70]
    q = rand((sum(lq), nh, d), device)
    k = rand((sum(lk), nkv, d), device)
    v = rand((sum(lk), nkv, d), device)
    cq = torch.tensor([0, 40, 41], device=device, dtype=torch.int32)
    ckk = torch.tensor([0, 100, 170], device=device, dtype=torch.int32)
    o = call(q, k, v, cq, ckk, 40, 100)
    e = max(rel_err(o[:40], _attn_ref(q[None, :40].transpose(1, 2), k[None, :100].transpose(1, 2),
                                      v[None, :100].transpose(1, 2), scale)[0].transpose(0, 1)),
            rel_err(o[40:], _attn_ref(q[None, 40:].transpose(1, 2), k[None, 100:].transpose(1, 2),
                                      v[None, 100:].transpose(1, 2), scale)[0].transpose(0, 1)))
    checks["mixed_varlen"] = e
    log(f"mixed varlen check {e:.2e}")
    impl = "aten._flash_attention_forward varlen (FA2), contiguous packed K/V, GQA native"
    for p in prefills:
        for nd in decodes:
            for c in dctx:
                if not budget.ok():
                    return
                lqs = [p] + [1] * nd
                lks = [p] + [c] * nd
                tq, tk = sum(lqs), sum(lks)
                q = rand((tq, nh, d), device)
                k = rand((tk, nkv, d), device)
                v = rand((tk, nkv, d), device)
                cq = torch.tensor([0, *accumulate(lqs)], device=device, dtype=torch.int32)
                ckk = torch.tensor([0, *accumulate(lks)], device=device, dtype=torch.int32)
                cqd = (torch.arange(nd + 1, device=device, dtype=torch.int32))
                ckd = (torch.arange(nd + 1, device=device, dtype=torch.int32) * c)
                forms = {
                    "mixed_varlen_one_call": lambda i: call(q, k, v, cq, ckk, p, max(p, c)),
                    "mixed_prefill_alone": lambda i: call(q[:p], k[:p], v[:p], cq[:2], ckk[:2], p, p),
                    "mixed_decodes_alone": lambda i: call(q[p:], k[p:], v[p:], cqd, ckd, 1, c),
                }
                work = p * (p + 1) / 2 + nd * c
                for name, f in forms.items():
                    r = bench(f, device)
                    sink.add(part="gpu_prefill_attn", model=model, tp=1, op=name, impl=impl,
                             dtype="bf16", tokens=tq, batch=1 + nd, chunk=p, context=c,
                             context_sum=nd * c, heads=nh, kv_heads=nkv, head_dim=d,
                             note=f"prefill chunk {p} ctx 0 + {nd} decodes at ctx {c}; work_tokens2={work:.6g}",
                             **r)
                del q, k, v
    free_gpu()


# ------------------------------------------------------------------------------------------
def _fa2_paged(q, kc, vc, bt, cu_q, cu_k, max_k, scale):
    return torch.ops.aten._flash_attention_forward(
        q, kc, vc, cu_q, cu_k, 1, max_k, 0.0, False, False, scale=scale, block_table=bt)[0]


def decode(sink: CsvSink, budget: Budget, device: str, model: str, tps, batches, contexts,
           max_tokens: int, checks: dict, try_fa2: bool = True, mixed: bool = True) -> None:
    spec = get_model(model)
    d = spec.head_dim
    scale = d ** -0.5
    page = 16
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 4
    target = 4 * sms
    cfg = {"block_n": 64, "num_warps": 4, "num_stages": 2}
    for ti, tp in enumerate(tps):
        nh, nkv = spec.heads_per_rank(tp)
        points = [(b, c) for b in batches for c in contexts if b * c <= max_tokens]
        need = max(b * -(-c // page) for b, c in points)
        nb = need + 64
        log(f"decode tp{tp}: heads {nh}/{nkv}, pool {nb} blocks = {2 * nb * page * nkv * d * 2 / 2**30:.1f} GiB")
        kc = rand((nb, page, nkv, d), device)
        vc = rand((nb, page, nkv, d), device)

        def tables(b, c, blk=page, pool=nb):
            nblk = -(-c // blk)
            if b * nblk > pool:  # more blocks than the pool holds: draw with replacement
                return torch.randint(0, pool, (b, nblk), device=device, dtype=torch.int32)
            return torch.randperm(pool, device=device)[: b * nblk].view(b, nblk).to(torch.int32)

        # correctness: triton vs float reference, mixed lengths
        b0 = 5
        sl = torch.tensor([1, 17, 300, 1000, 64], device=device, dtype=torch.int32)
        bt = tables(b0, 1000)
        q = rand((b0, nh, d), device)
        ref = TK.paged_decode_ref(q, kc, vc, bt, sl, scale)
        e = rel_err(TK.paged_decode(q, kc, vc, bt, sl, 1000, scale, target_programs=target, **cfg), ref)
        e2 = rel_err(TK.paged_decode(q, kc, vc, bt, sl, 1000, scale, target_programs=8, **cfg), ref)
        checks[f"decode_triton_tp{tp}"] = [e, e2]
        log(f"decode triton check {e:.2e} (split) {e2:.2e} (few splits)")
        fa2_ok = False
        nb256 = nb // 16
        kc256 = kc[: nb256 * 16].view(nb256, 256, nkv, d)
        vc256 = vc[: nb256 * 16].view(nb256, 256, nkv, d)
        if try_fa2 and device == "cuda":
            fa2_ok = _check_fa2_paged(kc256, vc256, b0, nh, d, scale, tables, nb256, device,
                                      checks, tp)
        if ti == 0 and device == "cuda":
            cfg = _tune_decode(kc, vc, nh, d, scale, target, tables, device, checks)

        impl_t = (f"triton split-K paged decode (simserve.calibrate.triton_kernels), page {page}, "
                  f"block_n {cfg['block_n']} warps {cfg['num_warps']} stages {cfg['num_stages']}")
        impl_f = "aten._flash_attention_forward varlen + block_table (FA2 paged KV), page 256"
        for b, c in points:
            if not budget.ok():
                log("decode: budget spent")
                return
            nbytes = b * c * nkv * d * 2 * 2 + 2 * b * nh * d * 2
            nrot = _clamp(math.ceil(ROT_BYTES / nbytes), 1, 4)
            q = rand((b, nh, d), device)
            out = torch.empty_like(q)
            sl = torch.full((b,), c, device=device, dtype=torch.int32)
            tabs = [tables(b, c) for _ in range(nrot)]
            r = bench(lambda i: TK.paged_decode(q, kc, vc, tabs[i % nrot], sl, c, scale, out,
                                                target_programs=target, **cfg), device)
            common = dict(part="gpu_decode_attn", model=model, tp=tp, dtype="bf16", tokens=b,
                          batch=b, context=c, context_sum=b * c, heads=nh, kv_heads=nkv,
                          head_dim=d, bytes=nbytes, flops=4.0 * b * nh * d * c)
            sink.add(op="decode_attn", impl=impl_t, **common, **r)
            if fa2_ok:
                tabs2 = [tables(b, c, 256, nb256) for _ in range(nrot)]
                cu_q = torch.arange(b + 1, device=device, dtype=torch.int32)
                cu_k = torch.arange(b + 1, device=device, dtype=torch.int32) * c
                r2 = bench(lambda i: _fa2_paged(q, kc256, vc256, tabs2[i % nrot], cu_q, cu_k, c, scale), device)
                sink.add(op="decode_attn", impl=impl_f, **common, **r2)
            if c == contexts[-1] or b * c * 2 > max_tokens:
                log(f"  decode b={b} ctx={c}: triton {r['median_us']:.1f}us "
                    f"({nbytes / r['median_us'] / 1e3:.0f} GB/s)"
                    + (f", fa2 {r2['median_us']:.1f}us" if fa2_ok else ""))
        if mixed and tp == tps[0]:
            _decode_mixed(sink, budget, device, model, tp, nh, nkv, d, kc, vc, tables, scale,
                          target, cfg, impl_t, max_tokens)
        log(f"decode tp{tp} done, budget left {budget.left():.0f}s")
        del kc, vc, kc256, vc256
        free_gpu()


def _check_fa2_paged(kc256, vc256, b0, nh, d, scale, tables, nb256, device, checks, tp) -> bool:
    """FA2's paged varlen kernel (256-token pages) against the float reference, mixed lengths;
    True when it runs and agrees (then decode times it beside Triton)."""
    fa2_ok = False
    try:
        sl2 = torch.tensor([1, 17, 300, 1000, 600], device=device, dtype=torch.int32)
        bt2 = tables(b0, 1024, 256, nb256)
        q2 = rand((b0, nh, d), device)
        cu_q = torch.arange(b0 + 1, device=device, dtype=torch.int32)
        cu_k = torch.cat([torch.zeros(1, device=device, dtype=torch.int32), sl2.cumsum(0).int()])
        o = _fa2_paged(q2, kc256, vc256, bt2, cu_q, cu_k, 1000, scale)
        e3 = rel_err(o, TK.paged_decode_ref(q2, kc256, vc256, bt2, sl2, scale))
        fa2_ok = e3 < 2e-2
        checks[f"decode_fa2_paged256_tp{tp}"] = e3
        log(f"decode FA2 paged(256) check {e3:.2e}")
    except Exception as ex:  # noqa: BLE001
        checks[f"decode_fa2_paged256_tp{tp}"] = f"failed: {ex}"[:300]
        log(f"decode FA2 paged failed: {str(ex)[:300]}")
    return fa2_ok


def _decode_mixed(sink: CsvSink, budget: Budget, device: str, model: str, tp: int, nh: int,
                  nkv: int, d: int, kc, vc, tables, scale, target, cfg: dict, impl_t: str,
                  max_tokens: int) -> None:
    """Decode batches of mixed, log-uniform contexts (64..16384; seeded), two draws per size."""
    gen = torch.Generator().manual_seed(1234)
    for b in (4, 16, 64, 256):
        for rep in range(2):
            if not budget.ok():
                break
            cl = torch.exp(torch.empty(b).uniform_(math.log(64), math.log(16384), generator=gen)).long()
            cmax = int(cl.max())
            if int(cl.sum()) > max_tokens:
                continue
            sl = cl.to(device=device, dtype=torch.int32)
            bt = tables(b, cmax)
            q = rand((b, nh, d), device)
            r = bench(lambda i: TK.paged_decode(q, kc, vc, bt, sl, cmax, scale,
                                                target_programs=target, **cfg), device)
            sink.add(part="gpu_decode_attn", model=model, tp=tp, op="decode_attn_mixed_ctx",
                     impl=impl_t, dtype="bf16", tokens=b, batch=b, context=cmax,
                     context_sum=int(cl.sum()), heads=nh, kv_heads=nkv, head_dim=d,
                     bytes=int(cl.sum()) * nkv * d * 4 + 2 * b * nh * d * 2,
                     flops=4.0 * nh * d * int(cl.sum()),
                     note="log-uniform contexts 64..16384; context column = max", **r)


def _tune_decode(kc, vc, nh, d, scale, target, tables, device, checks) -> dict:
    """Pick the Triton decode config that is fastest on two representative shapes."""
    cands = [(32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 4, 2)]
    cases = [(64, 4096), (1, 32768), (256, 1024)]
    res = {}
    for bn, nw, ns in cands:
        cfg = {"block_n": bn, "num_warps": nw, "num_stages": ns}
        tot = 0.0
        try:
            for b, c in cases:
                q = rand((b, nh, d), device)
                sl = torch.full((b,), c, device=device, dtype=torch.int32)
                tabs = [tables(b, c) for _ in range(2)]
                r = bench(lambda i: TK.paged_decode(q, kc, vc, tabs[i % 2], sl, c, scale,
                                                    target_programs=target, **cfg), device,
                          max_reps=30, min_reps=5)
                tot += r["median_us"]
        except Exception as ex:  # noqa: BLE001
            log(f"decode config {cfg} failed: {str(ex)[:200]}")
            tot = float("inf")
        res[f"{bn}/{nw}/{ns}"] = tot
    best = min(res, key=res.get)
    bn, nw, ns = (int(x) for x in best.split("/"))
    checks["decode_tune_us_sum(block_n/warps/stages)"] = res
    log(f"decode tuning {res} -> {best}")
    return {"block_n": bn, "num_warps": nw, "num_stages": ns}
