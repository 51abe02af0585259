"""CPU parts: bf16 dense ops through oneDNN (AMX where the CPU has it) and decode attention
over a host KV cache, at a given number of threads."""
from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from ..models import get_model
from .timing import Budget, CsvSink, bench_wall, log, rand, rel_err

CPU_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
CPU_ROT_BYTES = 400 << 20  # beyond the L3 of a 16-core slice


def _packed_linear(x, pw):
    return torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], "")


def cpu_dense(sink: CsvSink, budget: Budget, checks: dict, threads: int, model: str,
              tokens=CPU_TOKENS, target_s: float = 0.1) -> None:
    torch.set_num_threads(threads)
    spec = get_model(model)
    gemms = list(spec.gemms(1)) + [spec.lm_head(1)]
    tmax = max(tokens)
    # host memory bandwidth ceiling: a 1 GiB copy (bytes read + written)
    n = 1 << 29
    a = rand((n,), "cpu")
    b = torch.empty_like(a)
    r = bench_wall(lambda i: b.copy_(a), target_s=0.3, min_reps=3, max_reps=10)
    sink.add(part="cpu", op="stream_copy", impl="tensor.copy_", dtype="bf16", bytes=4 * n,
             threads=threads, **r)
    log(f"cpu t{threads}: copy {4 * n / r['median_us'] / 1e3:.1f} GB/s")
    del a, b
    for g in gemms:
        if not budget.ok():
            log("cpu dense: budget spent")
            return
        nw = max(1, min(8, math.ceil(CPU_ROT_BYTES / (g.k * g.n * 2))))
        ws = [rand((g.n, g.k), "cpu", std=0.02) for _ in range(nw)]
        try:
            pws = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in ws]
        except Exception as ex:  # noqa: BLE001
            log(f"cpu: mkldnn packing failed: {ex}")
            pws = None
        x = rand((tmax, g.k), "cpu")
        key = f"cpu_{g.name}"
        if key not in checks:
            xs = x[:16]
            ref = xs.double() @ ws[0].double().t()
            checks[key] = {"eager": rel_err(torch.matmul(xs, ws[0].t()), ref)}
            if pws:
                checks[key]["mkldnn_packed"] = rel_err(_packed_linear(xs, pws[0]), ref)
        line = []
        verbose_left = [2 if g.name == "qkv" else 0]
        for t in tokens:
            if not budget.ok():
                break
            impls = {"eager torch.matmul(x, W.T)": lambda i, t=t: torch.matmul(x[:t], ws[i % nw].t())}
            if pws:
                impls["mkldnn._linear_pointwise prepacked (_reorder_linear_weight, batch_size=None)"] = \
                    lambda i, t=t: _packed_linear(x[:t], pws[i % nw])
                try:  # packed for this M, as inductor's freezing pass does for a static batch
                    pwt = [torch.ops.mkldnn._reorder_linear_weight(w, t) for w in ws]
                    impls["mkldnn._linear_pointwise prepacked (_reorder_linear_weight, batch_size=M)"] = \
                        lambda i, t=t, pwt=pwt: _packed_linear(x[:t], pwt[i % nw])
                except Exception as ex:  # noqa: BLE001
                    log(f"cpu: packing for M={t} failed: {ex}")
                if verbose_left[0] and t in (1, 64):
                    verbose_left[0] -= 1
                    log(f"oneDNN verbose, {g.name} M={t}: eager then packed(None) then packed(M)")
                    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                        for f in impls.values():
                            f(0)
                    sys.stdout.flush()
            best = None
            for impl, fn in impls.items():
                r = bench_wall(fn, target_s=target_s, min_reps=3, max_reps=30)
                sink.add(part="cpu", model=model, tp=1, op=g.name, impl=impl, dtype="bf16",
                         tokens=t, k=g.k, n=g.n, flops=2.0 * t * g.k * g.n,
                         bytes=(t * g.k + g.k * g.n + t * g.n) * 2, threads=threads, **r)
                best = r["median_us"] if best is None else min(best, r["median_us"])
            if t in (1, tmax):
                line.append(f"T={t}: {best:.0f}us")
        log(f"cpu t{threads} {g.name} {g.k}x{g.n}: " + ", ".join(line)
            + f" (budget left {budget.left():.0f}s)")
        del ws, pws, x


def cpu_attn(sink: CsvSink, budget: Budget, checks: dict, threads: int, model: str,
             batches=(1, 4, 16, 64, 256), contexts=(128, 512, 2048, 8192),
             max_tokens: int = 2 << 20, target_s: float = 0.1) -> None:
    """Decode attention (one query token) over a contiguous host KV cache [B, KVH, ctx, D]."""
    torch.set_num_threads(threads)
    spec = get_model(model)
    nh, nkv = spec.heads_per_rank(1)
    d = spec.head_dim
    impl = "F.scaled_dot_product_attention CPU (flash), enable_gqa=True, KV [B, KVH, ctx, D]"
    # correctness
    q = rand((2, nh, 1, d), "cpu")
    k = rand((2, nkv, 100, d), "cpu")
    v = rand((2, nkv, 100, d), "cpu")
    o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    g = nh // nkv
    s = (q.double() @ k.double().repeat_interleave(g, 1).transpose(-1, -2)) * d ** -0.5
    ref = torch.softmax(s, -1) @ v.double().repeat_interleave(g, 1)
    checks[f"cpu_attn_t{threads}"] = rel_err(o, ref)
    points = [(b, c) for b in batches for c in contexts if b * c <= max_tokens]
    pool_tok = max(b * c for b, c in points)
    pool_tok = max(pool_tok, min(max_tokens, 4 * pool_tok))
    kp = rand((pool_tok * nkv * d,), "cpu")
    vp = rand((pool_tok * nkv * d,), "cpu")
    for b, c in points:
        if not budget.ok():
            log("cpu attn: budget spent")
            break
        one = b * c * nkv * d
        nrot = max(1, pool_tok * nkv * d // one)
        qs = rand((b, nh, 1, d), "cpu")

        def fn(i, one=one, nrot=nrot, b=b, c=c, qs=qs):
            j = (i % nrot) * one
            kk = kp[j:j + one].view(b, nkv, c, d)
            vv = vp[j:j + one].view(b, nkv, c, d)
            return F.scaled_dot_product_attention(qs, kk, vv, enable_gqa=True)

        r = bench_wall(fn, target_s=target_s, min_reps=3, max_reps=30)
        nbytes = one * 2 * 2 + 2 * b * nh * d * 2
        sink.add(part="cpu", model=model, tp=1, op="decode_attn", impl=impl, dtype="bf16",
                 tokens=b, batch=b, context=c, context_sum=b * c, heads=nh, kv_heads=nkv,
                 head_dim=d, bytes=nbytes, flops=4.0 * b * nh * d * c, threads=threads, **r)
        if c == contexts[-1] or b == batches[-1]:
            log(f"cpu t{threads} attn b={b} ctx={c}: {r['median_us']:.0f}us "
                f"({nbytes / r['median_us'] / 1e3:.1f} GB/s)")
    del kp, vp
