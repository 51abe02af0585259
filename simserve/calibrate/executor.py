"""A real executor: one forward pass of a catalog model (random bf16 weights) over a batch of
prefill chunks and decodes on the GPU, built from the kernels calibration measures.

Per layer: fused add+RMSNorm, QKV GEMM, (Qwen3 q/k norm), RoPE, paged KV write, attention, O
GEMM, add+RMSNorm, gate/up GEMM, SiLU·mul, down GEMM (GEMMs: torch.matmul = cuBLAS; the rest:
`triton_kernels`). Then the final norm, LM head and argmax over the rows that sample.

Attention, as `mixed_attention` says (the cost model has the same switch):
  - "split": one FA2 call per prefill chunk (`aten._scaled_dot_product_flash_attention`,
    causal, K/V of context + chunk contiguous), one Triton paged-decode call for all decodes;
  - "varlen": one FA2 varlen call over prefill chunks and decodes (contiguous packed K/V).

Engine behaviour reproduced (`launch`):
  - "graph": every iteration is captured as one CUDA graph and replayed, as an engine that
    graphs its iterations (vLLM/SGLang decode graphs); host launch cost is not in the time;
  - "eager": kernels launched from Python, timed from the first kernel's start event to the
    last one's end (launch gaps included).

KV: one shared pool of pages; every layer gets its own random block table into it, so layers
read distinct memory as they do in an engine (the pool is far larger than L2). The prefill
context K/V is a contiguous slice at a random offset per layer.

Tensor parallelism (`tp` > 1, one process per GPU, torch.distributed initialised by the caller):
each rank holds 1/tp of the heads, of the FFN and of the vocabulary (the cost model's per-rank
shapes, `ModelSpec.gemms(tp)` / `lm_head(tp)`), and the O and down projections are followed by
an NCCL all-reduce; the LM head's argmax stays rank-local (no logit gather, as the cost model).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..models import get_model
from . import triton_kernels as TK
from .gpu_ops import _flash
from .timing import rand

PAGE = 16
MAX_POS = 65536
DECODE_CFG = {"block_n": 64, "num_warps": 4, "num_stages": 3}  # calibration's tuned choice


@dataclass
class ExecBatch:
    """Prefill chunks (new tokens after `ctx` cached ones; `sample` if the chunk ends its
    prompt) and decodes (attention length incl. the new token)."""

    chunks: list[int] = field(default_factory=list)
    chunk_ctx: list[int] = field(default_factory=list)
    chunk_sample: list[bool] = field(default_factory=list)
    decode_ctx: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.chunks) + len(self.decode_ctx)

    @property
    def num_sample_rows(self) -> int:
        return sum(bool(s) for s in self.chunk_sample) + len(self.decode_ctx)


class GpuExecutor:
    def __init__(self, model: str, layers: int | None = None, kv_pool_gib: float = 40.0,
                 mixed_attention: str = "split", launch: str = "graph", max_tokens: int = 16384,
                 device: str = "cuda", decode_cfg: dict | None = None, seed: int = 0,
                 tp: int = 1):
        if mixed_attention not in ("split", "varlen"):
            raise ValueError(f"mixed_attention: expected split or varlen, got {mixed_attention!r}")
        if launch not in ("graph", "eager", "queued"):
            raise ValueError(f"launch: expected graph, eager or queued, got {launch!r}")
        torch.manual_seed(seed)
        self.spec = s = get_model(model)
        self.L = layers or s.num_layers
        self.mixed, self.launch, self.dev = mixed_attention, launch, device
        self.cfg = dict(decode_cfg or DECODE_CFG)
        s.check_tp(tp)
        self.tp = tp
        h, d, ffn = s.hidden, s.head_dim, s.ffn // tp
        self.nh, self.nkv, self.d = s.num_heads // tp, s.num_kv_heads // tp, d
        self.scale = d ** -0.5
        w = []
        for _ in range(self.L):
            w.append(dict(ln1=rand((h,), device), ln2=rand((h,), device), qn=rand((d,), device),
                          qkv=rand(((self.nh + 2 * self.nkv) * d, h), device, std=0.02),
                          o=rand((h, self.nh * d), device, std=0.02),
                          gu=rand((2 * ffn, h), device, std=0.02),
                          dn=rand((h, ffn), device, std=0.02)))
        self.w = w
        self.lnf = rand((h,), device)
        self.head = rand((-(-s.vocab // tp), h), device, std=0.02)
        self.cs = TK.make_cos_sin(MAX_POS, d, device)
        page_bytes = PAGE * self.nkv * d * 2
        self.nblocks = int(kv_pool_gib * 2**30 / 2 / page_bytes)
        self.kc = rand((self.nblocks, PAGE, self.nkv, d), device)
        self.vc = rand((self.nblocks, PAGE, self.nkv, d), device)
        self.kflat = self.kc.view(-1, self.nkv, d)
        self.vflat = self.vc.view(-1, self.nkv, d)
        self.x = rand((max_tokens, h), device)
        self._host_s = 0.05  # last eager enqueue time (sizes the queued mode's GPU sleep)
        self.sms = (torch.cuda.get_device_properties(0).multi_processor_count
                    if device == "cuda" else 4)

    # -- inputs of one batch (made before capture: a graph may not allocate them) ------------
    def prepare(self, b: ExecBatch) -> dict:
        dev, L = self.dev, self.L
        T, B = b.num_tokens, len(b.decode_ctx)
        P = T - B
        if T > self.x.shape[0]:
            raise ValueError(f"batch of {T} tokens exceeds the executor's max_tokens")
        inp = {"T": T, "P": P, "B": B, "b": b}
        inp["pos"] = torch.randint(0, MAX_POS - 1, (T,), device=dev)
        inp["slots"] = [torch.randint(0, self.nblocks * PAGE, (T,), device=dev) for _ in range(L)]
        rows, start = [], 0
        for n, smp in zip(b.chunks, b.chunk_sample):
            start += n
            if smp:
                rows.append(start - 1)
        rows += list(range(P, T))
        inp["rows"] = torch.tensor(rows, device=dev, dtype=torch.int64)
        kv_tok = self.nblocks * PAGE
        lks = [c + n for n, c in zip(b.chunks, b.chunk_ctx)]
        if self.mixed == "split":
            inp["koff"] = [[int(torch.randint(0, kv_tok - lk, ())) for lk in lks] for _ in range(L)]
            if B:
                mx = max(b.decode_ctx)
                nblk = -(-mx // PAGE)
                inp["bt"] = [torch.randint(0, self.nblocks, (B, nblk), device=dev, dtype=torch.int32)
                             for _ in range(L)]
                inp["sl"] = torch.tensor(b.decode_ctx, device=dev, dtype=torch.int32)
                inp["maxlen"] = mx
        else:
            lq = list(b.chunks) + [1] * B
            lk = lks + list(b.decode_ctx)
            inp["cu_q"] = torch.tensor([0, *_acc(lq)], device=dev, dtype=torch.int32)
            inp["cu_k"] = torch.tensor([0, *_acc(lk)], device=dev, dtype=torch.int32)
            inp["max_q"], inp["max_k"], inp["tk"] = max(lq), max(lk), sum(lk)
            inp["koff"] = [int(torch.randint(0, kv_tok - sum(lk), ())) for _ in range(L)]
        return inp

    # -- the forward pass ---------------------------------------------------------------------
    def forward(self, inp: dict) -> torch.Tensor:
        T = inp["T"]
        nh, nkv, d, s = self.nh, self.nkv, self.d, self.spec
        h = self.x[:T].clone()
        res = torch.zeros_like(h)
        attn = torch.empty(T, nh * d, device=self.dev, dtype=torch.bfloat16)
        for li, w in enumerate(self.w):
            TK.rmsnorm_(h, w["ln1"], res)
            qkv = torch.matmul(h, w["qkv"].t())
            if s.qk_norm:
                TK.head_rmsnorm_(qkv, nh + nkv, d, w["qn"])
            TK.rope_(qkv, inp["pos"], self.cs, nh + nkv, d)
            TK.kv_write(qkv, self.kc, self.vc, inp["slots"][li], nh, nkv, d)
            if self.mixed == "split":
                self._split_attention(qkv, attn, inp, li)
            else:
                self._varlen_attention(qkv, attn, inp, li)
            h = self._reduce(torch.matmul(attn, w["o"].t()))
            TK.rmsnorm_(h, w["ln2"], res)
            h = self._reduce(torch.matmul(TK.silu_mul(torch.matmul(h, w["gu"].t())), w["dn"].t()))
        rows = inp["rows"]
        hs, rs = h.index_select(0, rows), res.index_select(0, rows)
        TK.rmsnorm_(hs, self.lnf, rs)
        return torch.argmax(torch.matmul(hs, self.head.t()), dim=-1)

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The TP all-reduce of a row-parallel projection's output (nothing at TP 1)."""
        if self.tp > 1:
            dist.all_reduce(x)
        return x

    def _split_attention(self, qkv, attn, inp, li):
        nh, nkv, d = self.nh, self.nkv, self.d
        b, start = inp["b"], 0
        for i, (n, c) in enumerate(zip(b.chunks, b.chunk_ctx)):
            lk, off = c + n, inp["koff"][li][i]
            q = qkv[start:start + n, : nh * d].view(1, n, nh, d).transpose(1, 2)
            k = self.kflat[off:off + lk].view(1, lk, nkv, d).transpose(1, 2)
            v = self.vflat[off:off + lk].view(1, lk, nkv, d).transpose(1, 2)
            o = _flash(q, k, v, self.scale)
            attn[start:start + n].view(n, nh, d).copy_(o[0].transpose(0, 1))
            start += n
        if inp["B"]:
            P, B = inp["P"], inp["B"]
            q = qkv[P:, : nh * d].view(B, nh, d)
            TK.paged_decode(q, self.kc, self.vc, inp["bt"][li], inp["sl"], inp["maxlen"],
                            self.scale, attn[P:].view(B, nh, d),
                            target_programs=4 * self.sms, **self.cfg)

    def _varlen_attention(self, qkv, attn, inp, li):
        nh, d, T = self.nh, self.d, inp["T"]
        off, tk = inp["koff"][li], inp["tk"]
        q = qkv[:, : nh * d].reshape(T, nh, d)
        o = torch.ops.aten._flash_attention_forward(
            q, self.kflat[off:off + tk], self.vflat[off:off + tk], inp["cu_q"], inp["cu_k"],
            inp["max_q"], inp["max_k"], 0.0, True, False, scale=self.scale)[0]
        attn.view(T, nh, d).copy_(o)

    # -- timing -------------------------------------------------------------------------------
    def measure(self, b: ExecBatch, reps: int = 3, launch: str | None = None,
                warmup: bool = True) -> dict:
        """Median time (µs) of the forward pass of `b`; `launch` overrides the executor's mode:
        "graph" (captured and replayed), "eager" (launch gaps included) or "queued" (eager
        kernels queued behind a GPU sleep, so the GPU never waits on the host: the kernels
        back to back on one stream, without graph capture). `starved` counts repeats whose
        host enqueue outlasted the sleep (their time may include launch gaps)."""
        mode = launch or self.launch
        inp = self.prepare(b)
        if warmup or mode == "graph":
            t0 = time.perf_counter()
            self.forward(inp)  # warm-up (Triton JIT, cuBLAS heuristics); its enqueue time
            self._host_s = time.perf_counter() - t0
            torch.cuda.synchronize()
        g = None
        if mode == "graph":
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.forward(inp)
            g.replay()
        ts, starved = [], 0
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            cover = min(0.5, 1.5 * self._host_s + 2e-3)
            for _attempt in range(3):  # a starved repeat (e.g. a Triton JIT compile) is redone
                if mode == "queued":
                    torch.cuda._sleep(int(cover * 2.0e9))
                e0.record()
                t0 = time.perf_counter()
                if g is not None:
                    g.replay()
                else:
                    self.forward(inp)
                host = time.perf_counter() - t0
                e1.record()
                torch.cuda.synchronize()
                if g is not None:
                    break
                self._host_s = host
                if not (mode == "queued" and host > cover):
                    break
                starved += 1
                cover = min(0.5, 1.5 * host + 2e-3)
            ts.append(e0.elapsed_time(e1) * 1e3)
        del g, inp
        ts.sort()
        return {"median_us": ts[len(ts) // 2], "min_us": ts[0], "max_us": ts[-1], "reps": reps,
                "host_enqueue_us": self._host_s * 1e6, "launch": mode, "starved": starved}


def _acc(xs):
    out, t = [], 0
    for x in xs:
        t += x
        out.append(t)
    return out


def weights_gib(model: str, layers: int | None = None) -> float:
    s = get_model(model)
    L = layers or s.num_layers
    per = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim * s.hidden + s.num_heads * s.head_dim \
        * s.hidden + 3 * s.ffn * s.hidden
    return (L * per + s.vocab * s.hidden) * 2 / 2**30


