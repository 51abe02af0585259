"""`SpCostModel` as LoongServe prices its prefill candidates: the same times, quicker.

LoongServe prices several candidate batches and SP degrees per prefill decision (its lending
rule compares degrees), none of them co-batching decodes (temporal isolation), and nearly
every candidate has a shard size not seen before. Two things are kept here:
- `prefill_s`: `iteration_s` with no decodes, which reduces to the linear layers of the
  busiest shard, the Ulysses all-to-alls and prefill attention (the split region is the
  prefill path alone), host time and the forward; the same operations in the same order,
  without the general path's array conversions and decode bookkeeping;
- `comm_us`: both all-to-alls of a layer by shard size, tabulated (the link's function
  evaluated elementwise over shard sizes: the scalar calls' floats) instead of evaluating the
  link's fitted function twice per new size;
- `decode_steps_s` with one busy rank (LoongServe's scale-down consolidates decodes, so
  this is the usual case): that rank's GPU model's consecutive steps
  (`GpuCostModel.decode_steps`), the same
  operations on the same values as the SP path, whose maximum over ranks and linear time of
  idle ranks (0) then change nothing.
Tests check all three against `SpCostModel`'s (whose decode-attention lines already take
`decode_steps_us`'s fast path).
"""
from __future__ import annotations

import numpy as np

from simserve.cost.sp import SpCostModel


class LoongCostModel(SpCostModel):
    """`SpCostModel` with a prefill-only iteration, tabulated all-to-alls and decode-attention
    lines priced as runs."""

    _comm_table: list | None = None  # µs of both all-to-alls by largest shard (tokens)

    def comm_us(self, max_shard_tokens: int) -> float:
        """`SpCostModel.comm_us`, from the table (grown to twice the size asked beyond it)."""
        tab = self._comm_table
        if tab is None or max_shard_tokens >= len(tab):
            tab = self._comm_table = self._comm_rows(max(2 * max_shard_tokens, 4096))
        return tab[max_shard_tokens]

    def _comm_rows(self, n: int) -> list[float]:
        """`SpCostModel.comm_us(s)` for s in 0 .. n − 1 (`alltoall_us` of each all-to-all's
        bytes, 0 for none, elementwise)."""
        if self._a2a is None:
            return [0.0] * n
        s = np.arange(n, dtype=np.int64)
        qkv = np.asarray(self._a2a(s * self.qkv_bytes_per_token), dtype=np.float64)
        out = np.asarray(self._a2a(s * self.out_bytes_per_token), dtype=np.float64)
        rows = (qkv + out).tolist()
        rows[0] = 0.0 + 0.0  # alltoall_us of no bytes is 0.0
        return rows

    def prefill_s(self, chunks: list[int], ctxs: list[int]) -> float:
        """`iteration_s(n_p, [0] * R, [0] * R, chunks, ctxs, len(chunks))` with the prompt
        tokens spread evenly over the R ranks (the first ones one more): seconds."""
        n = sum(chunks)
        if n == 0:  # iteration_s takes its decode-only path: no decodes, no time
            return 0.0
        q, rem = divmod(n, self.R)  # ranks hold q + 1 (the first rem of them) or q tokens
        busiest, rows = q + (1 if rem else 0), len(chunks)
        b = self.base
        t_lin = b.dense_layer_us(busiest)  # the linear layers' maximum over the ranks
        if rem and q:
            t_lin = max(t_lin, b.dense_layer_us(q))
        # prefill_path_us: both all-to-alls, then attention over every chunk
        t_p = self.comm_us(busiest) + float(self.sp_prefill_attn(
            np.array(chunks, dtype=np.int64), np.array(ctxs, dtype=np.int64)))
        layer = t_lin + t_p
        b._ensure(busiest if busiest >= rows else rows)
        # host_us: no decodes, one sequence per chunk
        return (b.iter_us + b.per_seq_us * rows + b.forward_us(busiest, layer, rows)) * 1e-6

    def decode_steps_s(self, n_d, c0, m0, lo: int, n: int) -> np.ndarray:
        """`SpCostModel.decode_steps_s`; with one busy rank, its GPU model's steps."""
        busy = [r for r, b in enumerate(n_d) if b > 0]
        if len(busy) != 1:
            return super().decode_steps_s(n_d, c0, m0, lo, n)
        r = busy[0]
        b = int(n_d[r])
        s0, m = int(c0[r]) + b * lo, int(m0[r]) + lo
        return self.base.decode_steps_array(b, s0, m, n)
