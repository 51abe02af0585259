"""Exact event leaping over the decode-only steps of `SpRanksEngine`'s ranks.

With no prefill pending and no KV in flight, every rank repeats a decode step with each of its
contexts one longer. k steps are priced at once (`SpCostModel.decode_steps_s`: the same floats
as one step at a time), in growing chunks until one ends at or after the next arrival,
limited to the steps whose KV fits every rank's pool, and applied in one go.
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from simserve.sim.leap import largest_k, steps_before

LEAP_CAP = 8192


def flat_decodes(decodes: list[list[int]]):
    """Every rank's decodes in one array, each rank's first index in it, and the counts."""
    lens = [len(ids) for ids in decodes]
    flat = np.fromiter(chain.from_iterable(decodes), dtype=np.int64, count=sum(lens))
    starts, i = [], 0
    for n in lens:
        starts.append(i)
        i += n
    return flat, starts, lens


def per_rank(ufunc, x: np.ndarray, starts: list, decodes: list[list[int]]) -> list:
    """`ufunc` reduced over each rank's stretch of `x` (laid out as `flat_decodes`; 0 for a
    rank without decodes), as Python numbers."""
    nz = [r for r, ids in enumerate(decodes) if ids]
    out = [0] * len(decodes)
    if nz:
        for r, v in zip(nz, ufunc.reduceat(x, [starts[r] for r in nz]).tolist()):
            out[r] = v
    return out


def leap_ranks(eng, cap: int = LEAP_CAP) -> int:
    """Leap the engine's ranks over as many decode-only steps as fit before the next arrival,
    at most `cap` (at least 2; 0: step instead)."""
    t, bs, decodes = eng.ctx.table, eng.cfg.block_size, eng.decodes
    ids, starts, nd = flat_decodes(decodes)
    if len(ids) == 0:
        return 0
    kmax = int(min((t.output[ids] - t.generated[ids]).min(), cap, LEAP_CAP))
    c, held = t.computed[ids], t.blocks[ids]
    free = [p.num_free for p in eng.pools]

    def new_blocks(k: int) -> list:
        return per_rank(np.add, np.maximum(0, -(-(c + k) // bs) - held), starts, decodes)

    kmax = largest_k(kmax, lambda k: all(x <= f for x, f in zip(new_blocks(k), free)))
    if kmax < 2:
        return 0
    c0 = per_rank(np.add, c + 1, starts, decodes)
    rmax = [m + 1 if n else 0 for m, n in zip(per_rank(np.maximum, c, starts, decodes), nd)]
    arrival = eng.ctx.source.next_arrival_s
    # price the steps in growing chunks, stopping once one ends at or after the next
    # arrival (each step's price and the running sum are the same as all at once)
    parts, last, lo, n = [], eng.clock, 0, 64
    while lo < kmax:
        d = eng.cost.decode_steps_s(nd, c0, rmax, lo, min(n, kmax - lo))
        e = np.cumsum(np.concatenate(([last], d)))[1:]
        parts.append(e)
        last, lo, n = e[-1], lo + len(e), 2 * n
        if last >= arrival:
            break
    ends = np.concatenate(parts)
    k = steps_before(ends, kmax, arrival)
    if k < 2:
        return 0
    for p, x in zip(eng.pools, new_blocks(k)):
        p.allocate(x)
    t.blocks[ids] = np.maximum(held, -(-(c + k) // bs))
    t.computed[ids] = c + k
    t.emit_many(ids, ends[:k - 1])
    if eng.ctx.recorder.trace is not None:
        eng.trace_ranks(eng.clock, float(ends[k - 1]), k)
    eng.clock = float(ends[k - 1])
    done = t.emit(ids, eng.clock)
    if len(done):
        eng._finish(done)
    eng.ctx.recorder.num_iterations += k
    eng._sample()
    return k
