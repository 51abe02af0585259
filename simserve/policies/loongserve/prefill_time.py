"""Time of one LoongServe prefill iteration: `SpCostModel.iteration_s` with no decodes.

LoongServe prices several candidate batches and SP degrees per prefill decision (its lending
rule compares degrees), and none of them co-batches decodes (temporal isolation). With every
rank's decode count 0, `iteration_s` reduces to the linear layers of the busiest shard, the
Ulysses all-to-alls and prefill attention (the split region is the prefill path alone), host
time and the forward; `prefill_s` does exactly those operations, in the same order, without
the general path's array conversions and decode bookkeeping (tests check the floats).
"""
from __future__ import annotations

import numpy as np

from simserve.cost.sp import SpCostModel


def prefill_s(cost: SpCostModel, chunks: list[int], ctxs: list[int]) -> float:
    """`cost.iteration_s(n_p, [0] * R, [0] * R, chunks, ctxs, len(chunks))` with the prompt
    tokens spread evenly over the R ranks (the first ones one more): seconds."""
    R, n = cost.R, sum(chunks)
    if n == 0:  # iteration_s takes its decode-only path: no decodes, no time
        return 0.0
    n_p = [n // R + (1 if r < n % R else 0) for r in range(R)]
    b = cost.base
    t_lin = max(b.dense_layer_us(x) for x in n_p)
    t_p = cost.prefill_path_us(n_p[0], np.array(chunks, dtype=np.int64),
                               np.array(ctxs, dtype=np.int64))
    layer = t_lin + t_p
    busiest, rows = n_p[0], len(chunks)  # the first rank holds the most tokens
    b._ensure(max(busiest, rows))
    return (cost.host_us([0], rows) + b.forward_us(busiest, layer, rows)) * 1e-6
