"""Small Triton kernels standing in for a serving engine's fused per-layer ops.

fused add+RMSNorm, per-head RMSNorm (Qwen3 q/k norm), NeoX RoPE in place on the packed QKV
buffer, SiLU-and-mul, the paged KV-cache write, and a split-K paged decode attention over a
[num_blocks, page, kv_heads, head_dim] cache (page 16, GQA handled by loading each KV head once
for its group of query heads).
"""
from __future__ import annotations

import torch
import triton

from simserve.hardware.triton_kernels_params import DECODE_MIN_SPLIT
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(X, R, W, n_rows, n_cols, hpt, stride_t, stride_h, stride_rt, eps,
                    HAS_RES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    rm = rows < n_rows
    cm = cols < n_cols
    m = rm[:, None] & cm[None, :]
    rows64 = rows.to(tl.int64)
    xo = (rows64 // hpt) * stride_t + (rows64 % hpt) * stride_h
    x = tl.load(X + xo[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        ro = rows64 * stride_rt
        r = tl.load(R + ro[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        x = x + r
        tl.store(R + ro[:, None] + cols[None, :], x.to(R.dtype.element_ty), mask=m)
    var = tl.sum(x * x, axis=1) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(W + cols, mask=cm, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(X + xo[:, None] + cols[None, :], y.to(X.dtype.element_ty), mask=m)


def rmsnorm_(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None,
             eps: float = 1e-6) -> torch.Tensor:
    """In place on x [T, H] (rows may be strided); with residual: residual += x; x = norm(residual)."""
    t, h = x.shape
    assert x.stride(1) == 1
    block_c = triton.next_power_of_2(h)
    block_r = max(1, min(16, 2048 // block_c))
    r = residual if residual is not None else x
    _rmsnorm_kernel[(triton.cdiv(t, block_r),)](
        x, r, weight, t, h, 1, x.stride(0), 0, r.stride(0), eps,
        HAS_RES=residual is not None, BLOCK_R=block_r, BLOCK_C=block_c,
        num_warps=8 if block_c >= 4096 else 4)
    return x


def head_rmsnorm_(qkv: torch.Tensor, n_heads: int, head_dim: int, weight: torch.Tensor,
                  eps: float = 1e-6) -> torch.Tensor:
    """Qwen3 q/k norm: RMSNorm over head_dim for the first n_heads heads of each token row."""
    t = qkv.shape[0]
    rows = t * n_heads
    block_c = triton.next_power_of_2(head_dim)
    block_r = 16
    _rmsnorm_kernel[(triton.cdiv(rows, block_r),)](
        qkv, qkv, weight, rows, head_dim, n_heads, qkv.stride(0), head_dim, 0, eps,
        HAS_RES=False, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    return qkv


@triton.jit
def _rope_kernel(QKV, POS, CS, stride_t, stride_cs, n_heads,
                 HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    hb = tl.program_id(1)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = heads < n_heads
    d = tl.arange(0, HALF)
    pos = tl.load(POS + t).to(tl.int64)
    cos = tl.load(CS + pos * stride_cs + d).to(tl.float32)
    sin = tl.load(CS + pos * stride_cs + HALF + d).to(tl.float32)
    base = QKV + t.to(tl.int64) * stride_t + heads[:, None] * (2 * HALF) + d[None, :]
    m = hm[:, None]
    x1 = tl.load(base, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=m, other=0.0).to(tl.float32)
    tl.store(base, (x1 * cos[None, :] - x2 * sin[None, :]).to(QKV.dtype.element_ty), mask=m)
    tl.store(base + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(QKV.dtype.element_ty), mask=m)


def rope_(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, n_heads: int,
          head_dim: int) -> torch.Tensor:
    """NeoX rotary embedding in place on the first n_heads (q and k) heads of packed qkv [T, W]."""
    t = qkv.shape[0]
    bh = 16
    _rope_kernel[(t, triton.cdiv(n_heads, bh))](
        qkv, positions, cos_sin, qkv.stride(0), cos_sin.stride(0), n_heads,
        HALF=head_dim // 2, BLOCK_H=bh, num_warps=4)
    return qkv


def rope_ref(qkv, positions, cos_sin, n_heads, head_dim):
    half = head_dim // 2
    x = qkv[:, : n_heads * head_dim].float().view(qkv.shape[0], n_heads, head_dim)
    cs = cos_sin[positions.long()].float()
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).view(qkv.shape[0], -1)


def make_cos_sin(max_pos: int, head_dim: int, device, dtype=torch.bfloat16, theta=500000.0):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    f = torch.arange(max_pos, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([f.cos(), f.sin()], dim=-1).to(dtype).contiguous()


@triton.jit
def _silu_mul_kernel(X, O, n, stride_x, stride_o, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < n
    a = tl.load(X + t * stride_x + c, mask=m, other=0.0).to(tl.float32)
    b = tl.load(X + t * stride_x + n + c, mask=m, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(O + t * stride_o + c, y.to(O.dtype.element_ty), mask=m)


def silu_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    t, n2 = x.shape
    n = n2 // 2
    if out is None:
        out = torch.empty(t, n, device=x.device, dtype=x.dtype)
    blk = 1024
    _silu_mul_kernel[(t, triton.cdiv(n, blk))](x, out, n, x.stride(0), out.stride(0),
                                              BLOCK=blk, num_warps=4)
    return out


@triton.jit
def _kv_write_kernel(QKV, KC, VC, SLOT, stride_t, k_off, v_off, n_kv,
                     stride_kb, stride_kt, stride_kh,
                     PAGE: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOT + t).to(tl.int64)
    blk = slot // PAGE
    off = slot % PAGE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, D)
    m = (h < n_kv)[:, None]
    src = QKV + t * stride_t + h[:, None] * D + d[None, :]
    k = tl.load(src + k_off, mask=m, other=0.0)
    v = tl.load(src + v_off, mask=m, other=0.0)
    dst = blk * stride_kb + off * stride_kt + h[:, None] * stride_kh + d[None, :]
    tl.store(KC + dst, k, mask=m)
    tl.store(VC + dst, v, mask=m)


def kv_write(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor, n_heads: int, n_kv: int, head_dim: int) -> None:
    """Scatter each token's K and V (slices of packed qkv) into the paged cache at its slot."""
    t = qkv.shape[0]
    page = k_cache.shape[1]
    _kv_write_kernel[(t,)](
        qkv, k_cache, v_cache, slots, qkv.stride(0), n_heads * head_dim,
        (n_heads + n_kv) * head_dim, n_kv, k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), PAGE=page, D=head_dim,
        BLOCK_H=max(2, triton.next_power_of_2(n_kv)), num_warps=2)


@triton.jit
def _paged_decode_stage1(Q, K, V, BT, SL, MO, ML, scale, split_len,
                         stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_btb,
                         stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh,
                         G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
                         PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.load(SL + b)
    start = s * split_len
    end = tl.minimum(start + split_len, seq_len)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D)
    gm = offs_g < G
    hq = kvh * G + offs_g
    q = tl.load(Q + b.to(tl.int64) * stride_qb + hq[:, None] * stride_qh + offs_d[None, :],
                mask=gm[:, None], other=0.0)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nm = offs_n < end
        page = tl.load(BT + b.to(tl.int64) * stride_btb + offs_n // PAGE, mask=nm, other=0)
        ko = page.to(tl.int64) * stride_kb + (offs_n % PAGE) * stride_kt + kvh * stride_kh
        k = tl.load(K + ko[:, None] + offs_d[None, :], mask=nm[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k)) * scale
        qk = tl.where(nm[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + ko[:, None] + offs_d[None, :], mask=nm[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    mo = MO + b.to(tl.int64) * stride_mob + hq[:, None] * stride_moh + s * stride_mos + offs_d[None, :]
    tl.store(mo, o, mask=gm[:, None])
    tl.store(ML + b.to(tl.int64) * stride_mlb + hq * stride_mlh + s, lse, mask=gm)


@triton.jit
def _paged_decode_stage2(MO, ML, O, n_splits, stride_mob, stride_moh, stride_mos,
                         stride_mlb, stride_mlh, stride_ob, stride_oh,
                         D: tl.constexpr, S_PAD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    sm = s < n_splits
    lse = tl.load(ML + b * stride_mlb + h * stride_mlh + s, mask=sm, other=float("-inf"))
    mx = tl.max(lse, 0)
    w = tl.where(sm, tl.exp(lse - mx), 0.0)
    d = tl.arange(0, D)
    mo = tl.load(MO + b * stride_mob + h * stride_moh + s[:, None] * stride_mos + d[None, :],
                 mask=sm[:, None], other=0.0)
    o = tl.sum(mo * w[:, None], 0) / tl.sum(w, 0)
    tl.store(O + b * stride_ob + h * stride_oh + d, o.to(O.dtype.element_ty))


def decode_splits(batch: int, kv_heads: int, max_len: int, block_n: int,
                  target_programs: int = 528, min_split: int = DECODE_MIN_SPLIT) -> tuple[int, int]:
    s = max(1, min(-(-target_programs // (batch * kv_heads)), -(-max_len // min_split)))
    split_len = -(-(-(-max_len // s)) // block_n) * block_n
    s = max(1, -(-max_len // split_len))
    return s, split_len


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, max_len: int,
                 scale: float | None = None, out: torch.Tensor | None = None,
                 block_n: int = 64, num_warps: int = 4, num_stages: int = 2,
                 target_programs: int = 528) -> torch.Tensor:
    """q [B, H, D]; caches [NB, PAGE, KVH, D]; block_table [B, max_blocks] int32; seq_lens [B]."""
    b, h, d = q.shape
    _, page, kvh, _ = k_cache.shape
    g = h // kvh
    scale = scale if scale is not None else d ** -0.5
    s, split_len = decode_splits(b, kvh, max_len, block_n, target_programs)
    mo = torch.empty(b, h, s, d, device=q.device, dtype=torch.float32)
    ml = torch.empty(b, h, s, device=q.device, dtype=torch.float32)
    if out is None:
        out = torch.empty_like(q)
    _paged_decode_stage1[(b, kvh, s)](
        q, k_cache, v_cache, block_table, seq_lens, mo, ml, scale, split_len,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0), mo.stride(0), mo.stride(1), mo.stride(2), ml.stride(0), ml.stride(1),
        G=g, G_PAD=max(16, triton.next_power_of_2(g)), D=d, PAGE=page, BLOCK_N=block_n,
        num_warps=num_warps, num_stages=num_stages)
    _paged_decode_stage2[(b, h)](
        mo, ml, out, s, mo.stride(0), mo.stride(1), mo.stride(2), ml.stride(0), ml.stride(1),
        out.stride(0), out.stride(1), D=d, S_PAD=max(2, triton.next_power_of_2(s)), num_warps=4)
    return out


def paged_decode_ref(q, k_cache, v_cache, block_table, seq_lens, scale=None) -> torch.Tensor:
    b, h, d = q.shape
    _, page, kvh, _ = k_cache.shape
    g = h // kvh
    scale = scale if scale is not None else d ** -0.5
    outs = []
    for i in range(b):
        n = int(seq_lens[i])
        blocks = block_table[i, : -(-n // page)].long()
        k = k_cache[blocks].reshape(-1, kvh, d)[:n].float().repeat_interleave(g, dim=1)
        v = v_cache[blocks].reshape(-1, kvh, d)[:n].float().repeat_interleave(g, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i].float(), k) * scale
        p = torch.softmax(s, dim=-1)
        outs.append(torch.einsum("hn,nhd->hd", p, v))
    return torch.stack(outs)
