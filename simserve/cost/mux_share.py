"""`SmShareCost` as MuxWise's engine asks it: the same prices, with its repeated work kept.

MuxWise prices a decode step or a prefill batch on one of a few SM shares at every split step,
and each price re-evaluates the share's throughput curves (`compute`, `bw`: an interpolation)
and, for a prefill batch of a new size, every linear op's fitted curve. Here the shares'
throughputs are memoised, the linear ops' curves are tabulated once over the cost model's
token range (an elementwise evaluation of the same curves: the same floats), and consecutive
decode steps are priced as one run (`decode_run_s`). Tests check every price against
`SmShareCost`'s.
"""
from __future__ import annotations

import numpy as np

from simserve.cost.smshare import SmShareCost
from simserve.hardware.attention import decode_steps_us


class MuxShareCost(SmShareCost):
    """`SmShareCost` with memoised share throughputs and linear ops tabulated up to
    `table_tokens` tokens."""

    def __init__(self, cost, bw_saturation: float, curves: dict | None = None,
                 table_tokens: int = 16384):
        self.table_tokens = table_tokens
        super().__init__(cost, bw_saturation, curves)

    def use_curves(self, curves: dict | None) -> None:
        super().use_curves(curves)
        self._shares: dict = {}   # ("compute" | "bw", f) -> share of whole-GPU throughput
        self._tables = None       # op name -> µs by tokens, and 2 all-reduces by tokens

    def bw(self, f: float) -> float:
        v = self._shares.get(("bw", f))
        if v is None:
            v = self._shares["bw", f] = super().bw(f)
        return v

    def compute(self, f: float) -> float:
        v = self._shares.get(("compute", f))
        if v is None:
            v = self._shares["compute", f] = super().compute(f)
        return v

    def _op_tables(self):
        """Each linear op's curve, and 2 × the TP all-reduce, at 0 .. `table_tokens` tokens
        (the curves evaluated elementwise: the scalar calls' floats)."""
        if self._tables is None:
            c = self.cost
            t = np.arange(self.table_tokens + 1, dtype=np.float64)
            ops = {name: np.asarray(curve(t), dtype=np.float64).tolist()
                   for name, curve in c.ops.dense.items()}
            ar = (2.0 * np.asarray(c.allreduce_us(t), dtype=np.float64)).tolist()
            self._tables = ops, ar
        return self._tables

    def dense_us(self, tokens: int, f: float, allreduce: bool = True) -> float:
        """`SmShareCost.dense_us`, each op's time read from its table (within its range)."""
        key = ("dense", tokens, f, allreduce)
        us = self._memo.get(key)
        if us is not None:
            return us
        ops, ar = self._op_tables()
        if tokens >= len(ar):
            return super().dense_us(tokens, f, allreduce)
        if len(self._memo) > 1 << 16:
            self._memo.clear()
        us = 0.0
        for name in self.cost.ops.dense:  # in the cost model's order, as dense_us adds them
            t = ops[name][tokens]
            if name in self.gemms:
                us += self._gemm(self.gemms[name], t, tokens, f)
            else:  # element-wise: memory-bound
                us += self._scaled(t, 0.0, 1.0, f)
        us = self._memo[key] = us + (ar[tokens] if allreduce else 0.0)
        return us

    def decode_run_s(self, batch: int, ctx_sum0: int, ctx_max0: int, k: int,
                     f: float) -> np.ndarray:
        """`decode_steps_s` of k consecutive steps (Σ context ctx_sum0 + batch·j, longest
        ctx_max0 + j, j < k): the same floats, the attention priced as one run
        (`decode_steps_us`, fewer numpy calls than the general array path)."""
        c = self.cost
        if f >= 1.0:
            return c.decode_steps_s(batch, ctx_sum0, ctx_max0, k)
        ctx_sum = np.arange(k, dtype=np.int64)
        ctx_sum *= batch
        ctx_sum += ctx_sum0
        t = decode_steps_us(c._decode_fn, batch, ctx_sum0, ctx_max0, k)
        return self._decode_steps_on_share(batch, ctx_sum, t, f)
