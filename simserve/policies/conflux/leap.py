"""Exact event leaping for an XP instance: `sp_leap.leap_ranks`' leap, found in a cheaper order.

`leap_ranks` takes k = min(k_fit, k_arrival) steps: k_fit, the most steps whose KV growth fits
every rank's pool (a binary search, at least one block count per rank), and k_arrival, the
steps that start before the next arrival (priced in growing chunks up to k_fit). Here the steps
are priced first (up to the first finish, in the same chunks, so the same floats) and the pools
are checked at k_arrival only; a leap rarely outgrows the pools, and where it does, the search
below k_arrival finds the same min(k_fit, k_arrival) (fitting only turns false as k grows).
The tokens are written with `RequestTable.emit_steps` (the `emit_many` + `emit` of
`leap_ranks`, in one pass).
"""
from __future__ import annotations

import numpy as np

from simserve.policies.sp_leap import LEAP_CAP
from simserve.sim.leap import largest_k, steps_before


def leap_instance(eng, cap: int = LEAP_CAP) -> int:
    """`sp_leap.leap_ranks(eng, cap)` for an `engine.XpInstance`: the same steps, token times,
    pools and samples."""
    t, bs, R = eng.ctx.table, eng.cfg.block_size, eng.R
    ids, nd, nz, idx = eng._flat_decodes()
    if not nz:
        return 0
    gen = t.generated[ids]
    kmax = int(min(np.minimum.reduce(t.output[ids] - gen), cap, LEAP_CAP))
    if kmax < 2:
        return 0
    c = t.computed[ids]
    c0, rmax = [0] * R, [0] * R
    for r, x, m in zip(nz, np.add.reduceat(c, idx).tolist(),
                       np.maximum.reduceat(c, idx).tolist()):
        c0[r], rmax[r] = x + nd[r], m + 1
    arrival = eng.ctx.source.next_arrival_s
    # price the steps in growing chunks, stopping once one ends at or after the next
    # arrival (each step's price and the running sum are the same as all at once)
    parts, last, lo, n = [], eng.clock, 0, 64
    while lo < kmax:
        # np.cumsum([last, *d])[1:] in place: d is a fresh array, its first step plus `last`
        # is `last` plus it, and numpy's cumsum adds one element after another
        e = eng.cost.decode_steps_s(nd, c0, rmax, lo, min(n, kmax - lo))
        e[0] += last
        e.cumsum(out=e)
        parts.append(e)
        last, lo, n = e[-1], lo + len(e), 2 * n
        if last >= arrival:
            break
    ends = parts[0] if len(parts) == 1 else np.concatenate(parts)
    k = steps_before(ends, kmax, arrival)
    if k < 2:
        return 0
    held = t.blocks[ids]
    free = [p.num_free for p in eng.pools]

    def new_blocks(j: int) -> tuple[list, np.ndarray]:
        """Each rank's new blocks for j more tokens per decode, and every decode's blocks."""
        need = [0] * R
        blocks = (c + (j + bs - 1)) // bs
        nb = blocks - held
        np.maximum(nb, 0, out=nb)
        for r, x in zip(nz, np.add.reduceat(nb, idx).tolist()):
            need[r] = x
        return need, blocks

    grow, blocks = new_blocks(k)
    if not all(x <= f for x, f in zip(grow, free)):
        k = largest_k(k, lambda j: all(x <= f for x, f in zip(new_blocks(j)[0], free)))
        if k < 2:
            return 0
        grow, blocks = new_blocks(k)
    for p, x in zip(eng.pools, grow):
        p.allocate(x)
    np.maximum(blocks, held, out=blocks)
    t.blocks[ids] = blocks
    t.computed[ids] = c + k
    end = float(ends[k - 1])
    if eng.ctx.recorder.trace is not None:
        eng.trace_ranks(eng.clock, end, k)
    eng.clock = end
    done = t.emit_steps(ids, ends[:k], gen.tolist())
    if len(done):
        eng._finish(done)
    eng.ctx.recorder.num_iterations += k
    eng._sample()
    return k
