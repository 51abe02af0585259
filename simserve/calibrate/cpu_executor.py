"""A real CPU decode executor: one decode iteration of a catalog model (random bf16 weights) on
the host's cores, with the paths CPU calibration measured.

Per layer: add+RMSNorm, QKV (oneDNN prepacked bf16 linear: AMX where present), RoPE, KV append
into the host cache, decode attention (`F.scaled_dot_product_attention`, one query token per
sequence, KV [B, KVH, ctx, D] with one context length per batch: a padded-free uniform batch),
O, add+RMSNorm, gate/up, SiLU·mul, down. Then the final norm, LM head and sampling (argmax over
fp32 logits). `layers` may be fewer than the model's (the per-layer work is identical): the
cost model is asked for the same number. One rank (no CPU TP).
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..models import get_model
from .cpu_ops import _packed_linear
from .timing import rand


def _rms(x, w, res=None, eps=1e-6):
    if res is not None:
        res.add_(x)
        x = res
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class CpuExecutor:
    def __init__(self, model: str, threads: int, layers: int = 4, kv_pool_gib: float = 16.0,
                 seed: int = 0):
        torch.manual_seed(seed)
        torch.set_num_threads(threads)
        self.spec = s = get_model(model)
        self.threads, self.L = threads, layers
        h, d, ffn = s.hidden, s.head_dim, s.ffn
        self.nh, self.nkv, self.d = s.num_heads, s.num_kv_heads, d

        def lin(n, k):
            return torch.ops.mkldnn._reorder_linear_weight(rand((n, k), "cpu", std=0.02), None)

        self.w = [dict(ln1=rand((h,), "cpu"), ln2=rand((h,), "cpu"),
                       qkv=lin((self.nh + 2 * self.nkv) * d, h), o=lin(h, self.nh * d),
                       gu=lin(2 * ffn, h), dn=lin(h, ffn)) for _ in range(layers)]
        self.lnf = rand((h,), "cpu")
        self.head = lin(s.vocab, h)
        self.ffn = ffn
        self.pool_elems = int(kv_pool_gib * 2**30 / 2 / 2)
        self.kp = rand((self.pool_elems,), "cpu")
        self.vp = rand((self.pool_elems,), "cpu")
        half = d // 2
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.inv = inv
        self.half = half

    def forward(self, x, ctx: int, offs: list[int], stages: dict | None = None):
        """One decode iteration; with `stages`, adds each stage's wall time (µs) to it (CPU
        ops are synchronous, so the clock between them is their time)."""
        clock = time.perf_counter
        mark = [clock()]

        def lap(name):
            if stages is not None:
                t = clock()
                stages[name] = stages.get(name, 0.0) + (t - mark[0]) * 1e6
                mark[0] = t

        b = x.shape[0]
        nh, nkv, d, half = self.nh, self.nkv, self.d, self.half
        res = torch.zeros_like(x)
        h = x
        pos = torch.full((b,), ctx - 1, dtype=torch.float32)
        ang = pos[:, None] * self.inv[None, :]
        cos, sin = ang.cos().to(x.dtype)[:, None, :], ang.sin().to(x.dtype)[:, None, :]
        one = b * nkv * ctx * d
        lap("pre_layer")
        for li, w in enumerate(self.w):
            h = _rms(h, w["ln1"], res)
            qkv = _packed_linear(h, w["qkv"])
            qk = qkv[:, : (nh + nkv) * d].view(b, nh + nkv, d)
            x1, x2 = qk[..., :half], qk[..., half:]
            qk = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
            off = offs[li]
            k = self.kp[off:off + one].view(b, nkv, ctx, d)
            v = self.vp[off:off + one].view(b, nkv, ctx, d)
            k[:, :, ctx - 1].copy_(qk[:, nh:])
            v[:, :, ctx - 1].copy_(qkv[:, (nh + nkv) * d:].view(b, nkv, d))
            q = qk[:, :nh].unsqueeze(2)
            lap("pre_attention")
            o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            lap("attention")
            h = _packed_linear(o.reshape(b, nh * d), w["o"])
            lap("o")
            h = _rms(h, w["ln2"], res)
            gu = _packed_linear(h, w["gu"])
            lap("gate_up")
            h = _packed_linear(F.silu(gu[:, : self.ffn]) * gu[:, self.ffn:], w["dn"])
            lap("down")
        h = _rms(h, self.lnf, res)
        out = torch.argmax(_packed_linear(h, self.head).float(), dim=-1)
        lap("post_layer")
        return out

    def measure(self, batch: int, ctx: int, reps: int = 3) -> dict:
        one = batch * self.nkv * ctx * self.d
        if one > self.pool_elems:
            raise ValueError(f"CPU batch {batch} x {ctx} exceeds the host KV pool")
        x = rand((batch, self.spec.hidden), "cpu")
        gen = torch.Generator().manual_seed(batch * 100003 + ctx)

        def offs():
            return [int(torch.randint(0, self.pool_elems - one + 1, (), generator=gen))
                    for _ in range(self.L)]

        self.forward(x, ctx, offs())  # warm-up
        ts, st = [], {}
        for _ in range(reps):
            o = offs()
            t0 = time.perf_counter()
            self.forward(x, ctx, o, st)
            ts.append((time.perf_counter() - t0) * 1e6)
        ts.sort()
        return {"median_us": ts[len(ts) // 2], "min_us": ts[0], "max_us": ts[-1], "reps": reps,
                "stages_us": {k: v / reps for k, v in st.items()}}
