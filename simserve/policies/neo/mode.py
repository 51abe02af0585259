"""NEO's mode decision and sub-batch construction (policies.md §1.3), as a pure function.

Given the iteration's prefills (GPU- then CPU-destined, FIFO), its GPU decodes and the CPU
decoding queue, build b0 (prefills, GPU decodes, some CPU decodes), b1 (CPU decodes only) and
the GPU-only candidate g, then keep the pipeline only if its predicted request rate is higher.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from simserve.policies.neo.predictor import Predictor, SubBatch


@dataclass
class Decision:
    mode: str                       # "pipe" (b0 + b1), "gpu" (g alone) or "none" (b0 empty)
    num_pref_gpu: int = 0           # prefills kept: a prefix of the GPU-destined list ...
    num_pref_cpu: int = 0           # ... and of the CPU-destined list
    cdec: tuple = ((), ())          # CPU decode ids in b0 and in b1 (pipeline only)
    b0: SubBatch = field(default_factory=SubBatch)
    b1: SubBatch = field(default_factory=SubBatch)
    g: SubBatch = field(default_factory=SubBatch)
    rate_gpu: float = 0.0           # predicted requests per µs of per-layer GPU time
    rate_pipe: float = 0.0


def _pop_pref(b: SubBatch, length: int, us: float) -> None:
    b.n_pref -= 1
    b.pref_tokens -= length
    b.pref_us -= us


def _push_pref(b: SubBatch, length: int, us: float) -> None:
    b.n_pref += 1
    b.pref_tokens += length
    b.pref_us += us


def decide(pred: Predictor, pref_gpu_len, pref_cpu_len, n_gdec: int, gdec_ctx: int,
           cpu_ids: np.ndarray, cpu_len: np.ndarray, cpu_grow: np.ndarray, rows: int, toks: int,
           host_free: int, threshold: int, gdec_max: int = 0) -> Decision:
    """`cpu_*`: the CPU decoding queue in order (ids, seq_len, 1 if its next token needs a new
    host block; None when `host_free` covers every candidate); `rows`/`toks`: budget left; `host_free`: host blocks free for that growth;
    `gdec_max`: the longest GPU decode (priced in the pipeline's simulated time)."""
    lens = [int(x) for x in pref_gpu_len] + [int(x) for x in pref_cpu_len]
    is_gpu = [True] * len(pref_gpu_len) + [False] * len(pref_cpu_len)
    us = [pred.pref(x) for x in lens]
    b0 = SubBatch(len(lens), sum(lens), float(sum(us)), n_gdec, gdec_ctx, gdec_max=gdec_max)
    g = b0.copy()
    b1 = SubBatch()
    if b0.num_reqs == 0:
        return Decision("none")
    # the GPU-only candidate drops CPU-destined prefills from its tail while it stays wide
    k = len(lens)
    while k and not is_gpu[k - 1] and g.tokens - lens[k - 1] >= threshold:
        k -= 1
        _pop_pref(g, lens[k], us[k])
    k_g = k
    n_cpu_g = k_g - len(pref_gpu_len)

    def gpu_only() -> Decision:
        return Decision("gpu", len(pref_gpu_len), n_cpu_g, b0=b0, b1=b1, g=g)

    if len(cpu_ids) == 0:
        return gpu_only()
    # CPU decodes, FIFO, to the sub-batch with the larger slack; a rejected length bars longer
    lin0 = pred.lin(b0.tokens)
    start = 0
    # `cpu_grow` None: the host has a block for every candidate's growth (none is barred)
    eligible = None if cpu_grow is None else (cpu_grow == 0) | (host_free > 0)
    if rows >= 1 and toks >= 1:
        # fast path: while nothing has been accepted, a candidate goes alone into b1 and fits
        # iff T_cdec(1, len) + T_lnch <= T_lin(b0) (slack[0] is then positive)
        fits = pred.alone_us(cpu_len) <= lin0
        if eligible is not None:
            fits &= eligible
        start = int(fits.argmax())     # the first that fits (argmax: the first True)
        if not fits[start]:
            return gpu_only()
    tried = cpu_len[:start] if eligible is None else cpu_len[:start][eligible[:start]]
    min_bad = int(tried.min()) if len(tried) else np.iinfo(np.int64).max
    g_attn0 = b0.pref_us + pred.gdec(b0.n_gdec, b0.gdec_ctx)
    chosen: tuple[list, list] = ([], [])
    add0, add1 = chosen[0].append, chosen[1].append
    # b0's and b1's CPU decodes (count, Σ seq_len), tokens, T_lin of those tokens and CPU
    # time, as plain locals: a candidate is priced with one T_cdec call. The slack of the
    # sub-batch it does not go to changes only when a candidate is accepted: it is worked out
    # once then (`fixed`), with T_lin of the target's tokens + 1 (`grown`, memoised by tokens)
    lin, cdec, lnch = pred.lin, pred.cdec_positive(), pred.lnch_us
    lin_memo = getattr(pred, "lin_memo", {})   # T_lin by tokens (a pure function of them)
    n0, x0, t0, cpu0 = b0.n_cdec, b0.cdec_ctx, b0.tokens, 0.0
    n1, x1, t1, cpu1 = b1.n_cdec, b1.cdec_ctx, b1.tokens, 0.0
    lin0, lin1 = lin(t0), lin(t1)
    fixed = None     # to b1: slack[0] = T_lin(b1 + 1) + b0's GPU attention − b0's CPU time;
    nxt = 1          # to b0: slack[1] = T_lin(b0 + 1) − b1's CPU time
    room = min(rows, toks)   # rows and tokens left shrink together, one per accepted decode
    c_len, c_ids = cpu_len[start:].tolist(), cpu_ids[start:].tolist()
    c_grow = repeat(0) if cpu_grow is None else cpu_grow[start:].tolist()
    for ln, gr, rid in zip(c_len, c_grow, c_ids) if room >= 1 else ():
        if ln >= min_bad or (gr and host_free <= 0):
            continue
        if fixed is None:
            tg = (t1 if nxt else t0) + 1
            grown = lin_memo.get(tg)
            if grown is None:
                grown = lin_memo[tg] = lin(tg)
            fixed = grown + g_attn0 - cpu0 if nxt else grown - cpu1
        if nxt:              # to b1
            new_t = cdec(n1 + 1, x1 + ln) + lnch
            s0 = fixed
            s1 = lin0 - new_t
        else:                # to b0: slack[0] = T_lin(b1) + b0's GPU attention − its CPU time
            new_t = cdec(n0 + 1, x0 + ln) + lnch
            s0 = lin1 + g_attn0 - new_t
            s1 = fixed
        if s0 < 0 or s1 < 0:          # min(s0, s1) < 0
            min_bad = ln
            continue
        if nxt:
            n1 += 1
            x1 += ln
            t1 += 1
            lin1 = grown
            cpu1 = new_t
            add1(rid)
        else:
            n0 += 1
            x0 += ln
            t0 += 1
            lin0 = grown
            cpu0 = new_t
            add0(rid)
        fixed = None
        host_free -= gr
        nxt = 1 if s1 > s0 else 0
        room -= 1
        if room < 1:                  # the budget only shrinks when a candidate is accepted
            break
    b0.n_cdec, b0.cdec_ctx, b1.n_cdec, b1.cdec_ctx = n0, x0, n1, x1
    if b1.n_cdec == 0:
        # nothing accepted (the first accepted decode always goes to b1)
        return gpu_only()
    # b0 drops CPU-destined prefills from its tail while it stays wide and both slacks hold
    k = len(lens)
    while k and not is_gpu[k - 1]:
        _pop_pref(b0, lens[k - 1], us[k - 1])
        if b0.tokens < threshold or min(pred.slacks(b0, b1)) < 0:
            _push_pref(b0, lens[k - 1], us[k - 1])
            break
        k -= 1
    n_cpu_b0 = k - len(pref_gpu_len)
    t_seq = pred.L * pred.gpu_time(g)
    t_pipe = pred.L * (pred.gpu_time(b0) + pred.gpu_time(b1))
    rate_g, rate_p = g.num_reqs / t_seq, (b0.num_reqs + b1.num_reqs) / t_pipe
    if rate_g < rate_p:
        return Decision("pipe", len(pref_gpu_len), n_cpu_b0, (tuple(chosen[0]), tuple(chosen[1])),
                        b0, b1, g, rate_g, rate_p)
    d = gpu_only()
    d.rate_gpu, d.rate_pipe = rate_g, rate_p
    return d
