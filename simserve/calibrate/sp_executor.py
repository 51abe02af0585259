"""A real executor for Conflux Parallelism on R GPUs (one process per GPU, NCCL): one forward
pass in which a prefill is sequence-sharded over the ranks with Ulysses SP and every rank's
own decodes run beside its shard (ConfluxServe §4, Fig. 11). Random bf16 weights, the same
kernels as `GpuExecutor` (cuBLAS GEMMs, FA2, the Triton split-K paged decode and elementwise
kernels); each rank holds the full weights (TP 1 per rank).

Per layer on rank r, holding n_p^r prefill tokens (its shard of the concatenated chunks) and
B_r decodes:
  shared linear:   add+RMSNorm, QKV GEMM over n_p^r + B_r rows, (q/k norm), RoPE;
  split attention: the decode path — paged KV write of the decode tokens and paged decode
                   attention with all heads, on a side stream — beside the prefill path on the
                   main stream — pack the shard's QKV by head group, all-to-all (sequence shards
                   → head shards), write the chunk's K/V into this GPU's head-sharded cache,
                   FA2 per chunk over its context + chunk for nh/R query heads, all-to-all back;
  shared linear:   O GEMM, add+RMSNorm, gate/up GEMM, SiLU·mul, down GEMM.
Then the final norm and LM head over this rank's sampling rows (its decodes and the chunk
ends it holds).

`variant`: "overlap" (the two attention paths on two streams, as ConfluxServe runs them),
"serial" (both on one stream, decode path after the prefill path), "linear" (no attention
and no all-to-all: the shared linear region alone). The three give the split region's measured
overlap and its serial sum, from which contention factors α, β are calibrated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import dist_timing as DT
from . import triton_kernels as TK
from .executor import MAX_POS, PAGE, GpuExecutor
from .gpu_ops import _flash

VARIANTS = ("overlap", "serial", "linear")


@dataclass
class SpBatch:
    """Chunks (new tokens ℓ_i after c_i cached ones, `sample` if the chunk ends its prompt),
    concatenated and split into consecutive per-rank shards of `shards[r]` tokens, and every
    rank's decodes (attention length incl. the new token)."""

    chunks: list[int] = field(default_factory=list)
    chunk_ctx: list[int] = field(default_factory=list)
    chunk_sample: list[bool] = field(default_factory=list)
    shards: list[int] = field(default_factory=list)
    decode_ctx: list[list[int]] = field(default_factory=list)

    @classmethod
    def from_row(cls, b: dict) -> "SpBatch":
        get = (lambda k: json.loads(b[k]) if isinstance(b[k], str) else b[k])
        return cls(get("chunks"), get("chunk_ctx"), get("chunk_sample"), get("shards"),
                   get("decode_ctx"))

    def sample_rows(self, r: int) -> int:
        """LM-head rows on rank r: its decodes and the sampling chunk ends in its shard."""
        lo = sum(self.shards[:r])
        hi = lo + self.shards[r]
        end, n = 0, 0
        for ell, smp in zip(self.chunks, self.chunk_sample):
            end += ell
            n += int(bool(smp) and lo < end <= hi)
        return n + len(self.decode_ctx[r])


class SpExecutor(GpuExecutor):
    """Rank `dist.get_rank()` of an SP group spanning the whole default process group."""

    def __init__(self, model: str, sp_pool_tokens: int = 1 << 21, **kw):
        super().__init__(model, **kw)
        self.R, self.rank = dist.get_world_size(), dist.get_rank()
        if self.nh % self.R or self.nkv % self.R:
            raise ValueError(f"{model}: {self.nh} query / {self.nkv} KV heads do not split over "
                             f"{self.R} ranks")
        self.nhl, self.nkvl = self.nh // self.R, self.nkv // self.R
        self.hl = self.nhl + 2 * self.nkvl  # heads per group after the first all-to-all
        # this GPU's head shard of prefill KV (contiguous per sequence, random offset per layer)
        self.spk = torch.empty(sp_pool_tokens, self.nkvl, self.d, device=self.dev,
                               dtype=torch.bfloat16).normal_()
        self.spv = torch.empty_like(self.spk).normal_()
        self.side = torch.cuda.Stream()
        self.syncbuf = torch.ones(1, device=self.dev)

    # -- inputs (made before capture) ---------------------------------------------------------
    def prepare_sp(self, b: SpBatch) -> dict:
        dev, L, r = self.dev, self.L, self.rank
        npr, dec = b.shards[r], b.decode_ctx[r]
        B, T = len(dec), b.shards[r] + len(b.decode_ctx[r])
        if T > self.x.shape[0]:
            raise ValueError(f"rank {r}: {T} tokens exceed the executor's max_tokens")
        inp = {"T": T, "P": npr, "B": B, "Ptot": sum(b.chunks), "b": b}
        inp["pos"] = torch.randint(0, MAX_POS - 1, (max(T, 1),), device=dev)
        lo = sum(b.shards[:r])
        rows, end = [], 0
        for ell, smp in zip(b.chunks, b.chunk_sample):
            end += ell
            if smp and lo < end <= lo + npr:
                rows.append(end - 1 - lo)
        rows += list(range(npr, T))
        inp["rows"] = torch.tensor(rows, device=dev, dtype=torch.int64)
        if B:
            mx = max(dec)
            inp["slots"] = [torch.randint(0, self.nblocks * PAGE, (B,), device=dev) for _ in range(L)]
            inp["bt"] = [torch.randint(0, self.nblocks, (B, -(-mx // PAGE)), device=dev,
                                       dtype=torch.int32) for _ in range(L)]
            inp["sl"] = torch.tensor(dec, device=dev, dtype=torch.int32)
            inp["maxlen"] = mx
        if inp["Ptot"]:
            pool = self.spk.shape[0]
            lks = [c + n for n, c in zip(b.chunks, b.chunk_ctx)]
            if max(lks) > pool:
                raise ValueError(f"chunk context {max(lks)} exceeds the SP KV pool ({pool})")
            inp["koff"] = [[int(torch.randint(0, pool - lk + 1, ())) for lk in lks] for _ in range(L)]
            qkv_w = (self.nh + 2 * self.nkv) * self.d
            inp["send"] = torch.empty(self.R * npr, self.hl * self.d, device=dev, dtype=torch.bfloat16)
            inp["recv"] = torch.empty(inp["Ptot"], self.hl * self.d, device=dev, dtype=torch.bfloat16)
            inp["oloc"] = torch.empty(inp["Ptot"], self.nhl * self.d, device=dev, dtype=torch.bfloat16)
            inp["oback"] = torch.empty(self.R * npr, self.nhl * self.d, device=dev, dtype=torch.bfloat16)
            assert qkv_w == self.R * self.hl * self.d
        return inp

    # -- the forward pass ---------------------------------------------------------------------
    def forward_sp(self, inp: dict, variant: str = "overlap") -> torch.Tensor:
        if variant not in VARIANTS:
            raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
        T, B = inp["T"], inp["B"]
        nh, nkv, d, s = self.nh, self.nkv, self.d, self.spec
        h = self.x[:T].clone()
        res = torch.zeros_like(h)
        attn = torch.zeros(T, nh * d, device=self.dev, dtype=torch.bfloat16)
        main = torch.cuda.current_stream()
        for li, w in enumerate(self.w):
            TK.rmsnorm_(h, w["ln1"], res)
            qkv = torch.matmul(h, w["qkv"].t())
            if s.qk_norm:
                TK.head_rmsnorm_(qkv, nh + nkv, d, w["qn"])
            TK.rope_(qkv, inp["pos"][:T], self.cs, nh + nkv, d)
            if variant != "linear":
                if B and variant == "overlap":
                    self.side.wait_stream(main)
                    with torch.cuda.stream(self.side):
                        self._decode_path(qkv, attn, inp, li)
                if inp["Ptot"]:
                    self._prefill_path(qkv, attn, inp, li)
                if B and variant == "serial":
                    self._decode_path(qkv, attn, inp, li)
                if B and variant == "overlap":
                    main.wait_stream(self.side)
            h = torch.matmul(attn, w["o"].t())
            TK.rmsnorm_(h, w["ln2"], res)
            h = torch.matmul(TK.silu_mul(torch.matmul(h, w["gu"].t())), w["dn"].t())
        rows = inp["rows"]
        if rows.numel() == 0:
            return h[:0, :1]
        hs, rs = h.index_select(0, rows), res.index_select(0, rows)
        TK.rmsnorm_(hs, self.lnf, rs)
        return torch.argmax(torch.matmul(hs, self.head.t()), dim=-1)

    def _decode_path(self, qkv, attn, inp, li):
        P, B, nh, nkv, d = inp["P"], inp["B"], self.nh, self.nkv, self.d
        dq = qkv[P:]
        TK.kv_write(dq, self.kc, self.vc, inp["slots"][li], nh, nkv, d)
        TK.paged_decode(dq[:, : nh * d].view(B, nh, d), self.kc, self.vc, inp["bt"][li], inp["sl"],
                        inp["maxlen"], self.scale, attn[P:].view(B, nh, d),
                        target_programs=4 * self.sms, **self.cfg)

    def heads_pack(self, x: torch.Tensor) -> torch.Tensor:
        """(n, (nh+2nkv)·d) → (R·n, hl·d): rows [j·n, (j+1)·n) hold head group j's q, k, v."""
        n, R, d = x.shape[0], self.R, self.d
        v = x.view(n, self.nh + 2 * self.nkv, d)
        q = v[:, : self.nh].view(n, R, self.nhl, d)
        k = v[:, self.nh: self.nh + self.nkv].view(n, R, self.nkvl, d)
        vv = v[:, self.nh + self.nkv:].view(n, R, self.nkvl, d)
        return torch.cat([q, k, vv], dim=2).transpose(0, 1).reshape(R * n, self.hl * d)

    def _prefill_path(self, qkv, attn, inp, li):
        b, P, d, R = inp["b"], inp["P"], self.d, self.R
        send, recv, oloc, oback = inp["send"], inp["recv"], inp["oloc"], inp["oback"]
        if P:
            send.view(R * P, -1).copy_(self.heads_pack(qkv[:P]))
        dist.all_to_all_single(recv, send, output_split_sizes=list(b.shards),
                               input_split_sizes=[P] * R)
        rv = recv.view(-1, self.hl, d)
        start = 0
        for i, (n, c) in enumerate(zip(b.chunks, b.chunk_ctx)):
            off = inp["koff"][li][i]
            kk, vv = self.spk[off: off + c + n], self.spv[off: off + c + n]
            kk[c:].copy_(rv[start: start + n, self.nhl: self.nhl + self.nkvl])
            vv[c:].copy_(rv[start: start + n, self.nhl + self.nkvl:])
            q = rv[start: start + n, : self.nhl].transpose(0, 1).unsqueeze(0)
            o = _flash(q, kk.transpose(0, 1).unsqueeze(0), vv.transpose(0, 1).unsqueeze(0),
                       self.scale)
            oloc[start: start + n].view(n, self.nhl, d).copy_(o[0].transpose(0, 1))
            start += n
        dist.all_to_all_single(oback, oloc, output_split_sizes=[P] * R,
                               input_split_sizes=list(b.shards))
        if P:
            attn[:P].view(P, R, self.nhl, d).copy_(oback.view(R, P, self.nhl, d).transpose(0, 1))

    # -- timing -------------------------------------------------------------------------------
    def measure_sp(self, b: SpBatch, variants=VARIANTS, graph: bool = True, reps: int = 3) -> dict:
        """Median over `reps` of the max over ranks (µs) per variant, queued eager launches
        (GPU sleep covers the host) and, for "overlap" when `graph`, CUDA graph replays."""
        inp = self.prepare_sp(b)
        out = {}
        for v in variants:
            run = (lambda v=v: self.forward_sp(inp, v))
            host = DT.host_enqueue_s(run, self.dev)
            out[f"{v}_queued_us"] = DT.median_of_max(run, min(0.5, 1.5 * host + 2e-3),
                                                     self.syncbuf, reps)
            out[f"{v}_host_us"] = host * 1e6
        if graph and "overlap" in variants:
            out["overlap_graph_us"] = DT.graph_us(lambda: self.forward_sp(inp, "overlap"),
                                                  self.syncbuf, reps)
        return out


def check_sp(ex: SpExecutor, chunk: int = 384, shards: tuple[int, ...] | None = None) -> float:
    """Relative error of one Ulysses prefill attention layer (no cached context, uneven shards)
    against full-head attention on rank 0 over the gathered QKV (every rank returns it)."""
    R, d, nh, nkv = ex.R, ex.d, ex.nh, ex.nkv
    shards = list(shards or [chunk // R + (37 if r == 0 else -37 if r == 1 else 0) for r in range(R)])
    shards[-1] = chunk - sum(shards[:-1])
    b = SpBatch([chunk], [0], [True], shards, [[] for _ in range(R)])
    inp = ex.prepare_sp(b)
    P = shards[ex.rank]
    g = torch.Generator(device=ex.dev).manual_seed(7 + ex.rank)
    qkv = torch.randn(P, (nh + 2 * nkv) * d, device=ex.dev, generator=g).to(torch.bfloat16)
    attn = torch.zeros(P, nh * d, device=ex.dev, dtype=torch.bfloat16)
    ex._prefill_path(qkv, attn, inp, 0)
    parts = [torch.empty(s, qkv.shape[1], device=ex.dev, dtype=qkv.dtype) for s in shards]
    outs = [torch.empty(s, nh * d, device=ex.dev, dtype=attn.dtype) for s in shards]
    for j in range(R):  # uneven shards: one broadcast per rank instead of an all-gather
        if j == ex.rank:
            parts[j].copy_(qkv)
            outs[j].copy_(attn)
        dist.broadcast(parts[j], src=j)
        dist.broadcast(outs[j], src=j)
    full = torch.cat(parts).view(chunk, nh + 2 * nkv, d)
    q = full[:, :nh].transpose(0, 1).unsqueeze(0)
    k = full[:, nh: nh + nkv].transpose(0, 1).unsqueeze(0)
    v = full[:, nh + nkv:].transpose(0, 1).unsqueeze(0)
    ref = _flash(q, k, v, ex.scale)[0].transpose(0, 1).reshape(chunk, nh * d).float()
    got = torch.cat(outs).float()
    return float((got - ref).norm() / ref.norm())
