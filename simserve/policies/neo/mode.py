"""NEO's mode decision and sub-batch construction (policies.md §1.3).

Given the iteration's prefills (GPU- then CPU-destined, FIFO), its GPU decodes and the CPU
decoding queue, build b0 (prefills, GPU decodes, some CPU decodes), b1 (CPU decodes only) and
the GPU-only candidate g, then keep the pipeline only if its predicted request rate is higher.

Those two tests are NEO's GPU gating: a CPU decode runs only when its predicted attention
hides under the other sub-batch's GPU work (both slacks ≥ 0), and only in an iteration that
has GPU work and whose pipeline beats the GPU-only batch. `gpu_gating=False` (a what-if for
`explain`) drops both: every CPU decode the budget and host blocks allow runs in every
iteration (still split between b0 and b1 by the larger slack, still one pipelined
iteration with the GPU), CPU-destined prefills are never trimmed, and the pipeline is taken
whenever a CPU decode runs.
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


class ModeDecision:
    """One iteration's decision. State: the prefills (`lens`, `is_gpu`, their predicted
    attention `us`), the sub-batches b0, b1, g, and the CPU queue with its budget."""

    def __init__(self, pred: Predictor, pref_gpu_len, pref_cpu_len, n_gdec: int, gdec_ctx: int,
                 threshold: int, gdec_max: int = 0, gating: bool = True):
        self.pred, self.threshold, self.gating = pred, threshold, gating
        self.n_gpu_pref = len(pref_gpu_len)
        self.lens = [int(x) for x in pref_gpu_len] + [int(x) for x in pref_cpu_len]
        self.is_gpu = [True] * len(pref_gpu_len) + [False] * len(pref_cpu_len)
        self.us = [pred.pref(x) for x in self.lens]
        self.b0 = SubBatch(len(self.lens), sum(self.lens), float(sum(self.us)), n_gdec,
                           gdec_ctx, gdec_max=gdec_max)
        self.g = self.b0.copy()
        self.b1 = SubBatch()
        self.chosen: tuple[list, list] = ([], [])
        self.n_cpu_g = 0

    def trim_g(self) -> None:
        """The GPU-only candidate drops CPU-destined prefills from its tail while it stays
        `threshold` tokens wide (NEO's `linr_S_threshold`)."""
        g, lens, k = self.g, self.lens, len(self.lens)
        while k and not self.is_gpu[k - 1] and g.tokens - lens[k - 1] >= self.threshold:
            k -= 1
            _pop_pref(g, lens[k], self.us[k])
        self.n_cpu_g = k - self.n_gpu_pref

    def gpu_only(self) -> Decision:
        return Decision("gpu", self.n_gpu_pref, self.n_cpu_g, b0=self.b0, b1=self.b1, g=self.g)

    def first_fit(self, cpu_len, eligible, rows: int, toks: int) -> int | None:
        """Fast path of the scan: while nothing is accepted, a candidate goes alone into b1
        and fits iff T_cdec(1, len) + T_lnch <= T_lin(b0). The index of the first that fits
        (None: none does); every earlier one was tried and rejected. Ungated: 0."""
        if not self.gating or rows < 1 or toks < 1:
            return 0
        fits = self.pred.alone_us(cpu_len) <= self.pred.lin(self.b0.tokens)
        if eligible is not None:
            fits &= eligible
        start = int(fits.argmax())     # the first that fits (argmax: the first True)
        return start if fits[start] else None

    def place_cpu_decodes(self, cpu_ids, cpu_len, cpu_grow, rows: int, toks: int,
                          host_free: int, start: int, eligible) -> None:
        """CPU decodes, FIFO from `start`, each to the sub-batch with the larger slack; one
        that makes a slack negative is rejected and bars longer ones (gated only).

        b0's and b1's CPU decodes (count, Σ seq_len), tokens, T_lin of those tokens and CPU
        time are plain locals: a candidate is priced with one T_cdec call. The slack of the
        sub-batch it does not go to changes only when a candidate is accepted: it is worked
        out once then (`fixed`), with T_lin of the target's tokens + 1 (`grown`, memoised)."""
        pred, b0, b1, gating = self.pred, self.b0, self.b1, self.gating
        tried = cpu_len[:start] if eligible is None else cpu_len[:start][eligible[:start]]
        min_bad = int(tried.min()) if len(tried) else np.iinfo(np.int64).max
        g_attn0 = b0.pref_us + pred.gdec(b0.n_gdec, b0.gdec_ctx)
        add0, add1 = self.chosen[0].append, self.chosen[1].append
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
                s0, s1 = fixed, lin0 - new_t
            else:                # to b0: slack[0] = T_lin(b1) + b0's GPU attention − CPU time
                new_t = cdec(n0 + 1, x0 + ln) + lnch
                s0, s1 = lin1 + g_attn0 - new_t, fixed
            if gating and (s0 < 0 or s1 < 0):          # min(s0, s1) < 0
                min_bad = ln
                continue
            if nxt:
                n1, x1, t1, lin1, cpu1 = n1 + 1, x1 + ln, t1 + 1, grown, new_t
                add1(rid)
            else:
                n0, x0, t0, lin0, cpu0 = n0 + 1, x0 + ln, t0 + 1, grown, new_t
                add0(rid)
            fixed = None
            host_free -= gr
            nxt = 1 if s1 > s0 else 0
            room -= 1
            if room < 1:                  # the budget only shrinks when a candidate is accepted
                break
        b0.n_cdec, b0.cdec_ctx, b1.n_cdec, b1.cdec_ctx = n0, x0, n1, x1

    def trim_b0(self) -> int:
        """b0 drops CPU-destined prefills from its tail while it stays wide and both slacks
        hold (gated only); returns how many CPU-destined prefills it keeps."""
        b0, lens, us, k = self.b0, self.lens, self.us, len(self.lens)
        while self.gating and k and not self.is_gpu[k - 1]:
            _pop_pref(b0, lens[k - 1], us[k - 1])
            if b0.tokens < self.threshold or min(self.pred.slacks(b0, self.b1)) < 0:
                _push_pref(b0, lens[k - 1], us[k - 1])
                break
            k -= 1
        return k - self.n_gpu_pref

    def choose(self, n_cpu_b0: int) -> Decision:
        """The pipeline if its predicted request rate beats the GPU-only batch's (gated)."""
        pred, b0, b1, g = self.pred, self.b0, self.b1, self.g
        t_seq = pred.L * pred.gpu_time(g)
        t_pipe = pred.L * (pred.gpu_time(b0) + pred.gpu_time(b1))
        rate_g = g.num_reqs / t_seq if t_seq > 0 else 0.0
        rate_p = (b0.num_reqs + b1.num_reqs) / t_pipe
        if rate_g < rate_p or not self.gating:
            return Decision("pipe", self.n_gpu_pref, n_cpu_b0,
                            (tuple(self.chosen[0]), tuple(self.chosen[1])), b0, b1, g,
                            rate_g, rate_p)
        d = self.gpu_only()
        d.rate_gpu, d.rate_pipe = rate_g, rate_p
        return d


def decide(pred: Predictor, pref_gpu_len, pref_cpu_len, n_gdec: int, gdec_ctx: int,
           cpu_ids: np.ndarray, cpu_len: np.ndarray, cpu_grow: np.ndarray, rows: int, toks: int,
           host_free: int, threshold: int, gdec_max: int = 0, gating: bool = True) -> Decision:
    """`cpu_*`: the CPU decoding queue in order (ids, seq_len, 1 if its next token needs a new
    host block; None when `host_free` covers every candidate); `rows`/`toks`: budget left;
    `host_free`: host blocks free for that growth; `gdec_max`: the longest GPU decode (priced
    in the pipeline's simulated time); `gating`: NEO's GPU gating (module docstring)."""
    m = ModeDecision(pred, pref_gpu_len, pref_cpu_len, n_gdec, gdec_ctx, threshold, gdec_max,
                     gating)
    if m.b0.num_reqs == 0 and (gating or len(cpu_ids) == 0):
        return Decision("none")
    m.trim_g()
    if len(cpu_ids) == 0:
        return m.gpu_only()
    # `cpu_grow` None: the host has a block for every candidate's growth (none is barred)
    eligible = None if cpu_grow is None else (cpu_grow == 0) | (host_free > 0)
    start = m.first_fit(cpu_len, eligible, rows, toks)
    if start is None:
        return m.gpu_only()
    m.place_cpu_decodes(cpu_ids, cpu_len, cpu_grow, rows, toks, host_free, start, eligible)
    if m.b1.n_cdec == 0:
        # nothing accepted (the first accepted decode always goes to b1)
        return m.gpu_only() if m.b0.num_reqs else Decision("none")
    return m.choose(m.trim_b0())
