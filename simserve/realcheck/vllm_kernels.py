"""Time vLLM's own kernels on the GPU, on the grids simserve's profiles use (run where vLLM
imports; writes CSV rows that `simserve calibrate` style fits turn into tables).

    python3 -m simserve.realcheck.vllm_kernels --out DIR [--models llama-3.1-8b,qwen3-14b]

- attention (vLLM's FlashAttention build, `vllm.vllm_flash_attn.flash_attn_varlen_func`, FA3
  on Hopper), one layer at TP1, paged KV (block 16, blocks in random order, as a serving
  engine's pool ends up): prefill chunks (chunk × cached context grid), decodes (batch ×
  context grid), and mixed calls (one prefill chunk plus B decodes in one variable-length
  call, which is how vLLM's FLASH_ATTN backend runs a mixed batch);
- vLLM's fused ops: `rms_norm`, `fused_add_rms_norm`, `silu_and_mul`, `rotary_embedding`.
Each point is R calls captured in one CUDA graph and replayed (launch gaps excluded, as
calibration times ours), median of 5 replays, µs per call.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import time

SHAPES = {"llama-3.1-8b": dict(heads=32, kv=8, d=128, hidden=4096, ffn=14336),
          "qwen3-14b": dict(heads=40, kv=8, d=128, hidden=5120, ffn=17408)}
PREFILL_CHUNKS = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PREFILL_CTX = [0, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
DECODE_BATCH = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
DECODE_CTX = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
OP_TOKENS = [1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
POOL_TOKENS = 4 * 1024 * 1024
BLOCK = 16


def graph_us(torch, fn, reps: int = 20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1000.0 / reps)
    ts.sort()
    return ts[len(ts) // 2]


class Attn:
    def __init__(self, torch, shape):
        from vllm.vllm_flash_attn import flash_attn_varlen_func
        self.torch, self.f = torch, flash_attn_varlen_func
        self.h, self.kv, self.d = shape["heads"], shape["kv"], shape["d"]
        nb = POOL_TOKENS // BLOCK
        self.k = torch.randn(nb, BLOCK, self.kv, self.d, device="cuda", dtype=torch.bfloat16)
        self.v = torch.randn_like(self.k)
        self.perm = torch.randperm(nb, device="cuda", dtype=torch.int32)

    def call(self, q_lens, k_lens):
        """One varlen call: request i has q_lens[i] new tokens attending to k_lens[i] keys."""
        torch = self.torch
        n = len(q_lens)
        maxb = max(-(-k // BLOCK) for k in k_lens)
        bt = torch.zeros(n, maxb, dtype=torch.int32, device="cuda")
        off = 0
        for i, k in enumerate(k_lens):
            nb = -(-k // BLOCK)
            bt[i, :nb] = self.perm[off:off + nb]
            off += nb
        cu_q = torch.tensor([0] + list(_cumsum(q_lens)), dtype=torch.int32, device="cuda")
        seqused = torch.tensor(k_lens, dtype=torch.int32, device="cuda")
        q = torch.randn(sum(q_lens), self.h, self.d, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(q)
        mq, mk = max(q_lens), max(k_lens)
        scale = self.d ** -0.5

        def fn():
            self.f(q=q, k=self.k, v=self.v, max_seqlen_q=mq, cu_seqlens_q=cu_q,
                   max_seqlen_k=mk, seqused_k=seqused, softmax_scale=scale, causal=True,
                   block_table=bt, out=out, fa_version=3)
        return fn


def _cumsum(xs):
    s = 0
    for x in xs:
        s += x
        yield s


def attention_rows(torch, model, shape, w, log, deadline):
    a = Attn(torch, shape)
    for c in PREFILL_CHUNKS:
        for x in PREFILL_CTX:
            if time.monotonic() > deadline:
                return
            if c + x > POOL_TOKENS:
                continue
            us = graph_us(torch, a.call([c], [x + c]), reps=5 if c * (c + x) > 2 ** 26 else 20)
            w.writerow({"model": model, "kernel": "prefill_attn", "a": c, "b": x, "us": round(us, 3)})
    for b in DECODE_BATCH:
        for x in DECODE_CTX:
            if time.monotonic() > deadline:
                return
            if b * (x + 1) > POOL_TOKENS:
                continue
            us = graph_us(torch, a.call([1] * b, [x + 1] * b))
            w.writerow({"model": model, "kernel": "decode_attn", "a": b, "b": x, "us": round(us, 3)})
    # unequal contexts (decodes in one call with lengths spread log-uniform 1K..16K)
    import random
    rng = random.Random(5)
    for b in (4, 16, 64, 128, 256):
        for _ in range(3):
            ks = [int(2 ** rng.uniform(10, 14)) for _ in range(b)]
            if sum(ks) > POOL_TOKENS:
                continue
            us = graph_us(torch, a.call([1] * b, ks))
            w.writerow({"model": model, "kernel": "decode_attn_mixed", "a": b, "b": sum(ks),
                        "c": max(ks), "us": round(us, 3)})
    # a prefill chunk and B decodes in one call, against the chunk alone
    for c in (256, 1024, 4096):
        for b in (16, 64, 256):
            for x in (1024, 4096):
                if b * x + c > POOL_TOKENS:
                    continue
                us = graph_us(torch, a.call([c] + [1] * b, [c] + [x + 1] * b))
                w.writerow({"model": model, "kernel": "mixed_attn", "a": c, "b": b * (x + 1),
                            "c": b, "us": round(us, 3)})
    log(f"{model}: attention done")


def op_rows(torch, model, shape, w):
    from vllm import _custom_ops as ops
    H, F = shape["hidden"], shape["ffn"]
    wt = torch.randn(H, device="cuda", dtype=torch.bfloat16)
    cos_sin = torch.randn(131072, shape["d"], device="cuda", dtype=torch.bfloat16)
    for t in OP_TOKENS:
        x = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
        r = torch.randn_like(x)
        o = torch.empty_like(x)
        g = torch.randn(t, 2 * F, device="cuda", dtype=torch.bfloat16)
        go = torch.empty(t, F, device="cuda", dtype=torch.bfloat16)
        pos = torch.randint(0, 8192, (t,), device="cuda")
        q = torch.randn(t, shape["heads"] * shape["d"], device="cuda", dtype=torch.bfloat16)
        k = torch.randn(t, shape["kv"] * shape["d"], device="cuda", dtype=torch.bfloat16)
        for name, fn in (("rms_norm", lambda: ops.rms_norm(o, x, wt, 1e-6)),
                         ("fused_add_rms_norm", lambda: ops.fused_add_rms_norm(x, r, wt, 1e-6)),
                         ("silu_and_mul", lambda: ops.silu_and_mul(go, g)),
                         ("rotary_embedding", lambda: ops.rotary_embedding(
                             pos, q, k, shape["d"], cos_sin, True))):
            try:
                w.writerow({"model": model, "kernel": name, "a": t, "b": 0,
                            "us": round(graph_us(torch, fn), 3)})
            except Exception as exc:  # noqa: BLE001 - one op's API must not cost the rest
                w.writerow({"model": model, "kernel": name, "a": t, "b": -1, "us": "",
                            "c": repr(exc)[:120]})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="llama-3.1-8b,qwen3-14b")
    ap.add_argument("--budget-s", type=float, default=150)
    a = ap.parse_args(argv)
    import torch
    os.makedirs(a.out, exist_ok=True)
    t0 = time.monotonic()

    def log(m):
        print(f"[kernels {time.monotonic() - t0:6.1f}s] {m}", flush=True)

    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        import vllm
        meta["vllm"] = vllm.__version__
    except Exception as exc:  # noqa: BLE001
        meta["vllm_import_error"] = repr(exc)
    with open(os.path.join(a.out, "kernels.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["model", "kernel", "a", "b", "c", "us"])
        w.writeheader()
        models = a.models.split(",")
        for i, m in enumerate(models):
            deadline = t0 + a.budget_s * (i + 1) / len(models)
            for part in (lambda: op_rows(torch, m, SHAPES[m], w),
                         lambda: attention_rows(torch, m, SHAPES[m], w, log, deadline)):
                try:
                    part()
                except Exception as exc:  # noqa: BLE001
                    log(f"{m}: {exc!r}")
                    meta.setdefault("errors", []).append(f"{m}: {exc!r}")
                f.flush()
    meta["wall_s"] = time.monotonic() - t0
    with open(os.path.join(a.out, "kernels_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
