"""Exact event leaping for an XP instance: `sp_leap.leap_ranks`' leap, found in a cheaper order.

`leap_ranks` takes k = min(k_fit, k_arrival) steps: k_fit, the most steps whose KV growth fits
every rank's pool (a binary search, at least one block count per rank), and k_arrival, the
steps that start before the next arrival (priced in growing chunks up to k_fit). Here the steps
are priced first (up to the first finish, in the same chunks, so the same floats) and the pools
are checked at k_arrival only; a leap rarely outgrows the pools, and where it does, the search
below k_arrival finds the same min(k_fit, k_arrival) (fitting only turns false as k grows).
The tokens are written with `RequestTable.emit_steps` (the `emit_many` + `emit` of
`leap_ranks`, in one pass).

A leap that ends before the next arrival (at a finish, mostly) is followed by another: the
run loop would only wait until the leap's end, find nothing landed or pending, and call the
leap again from that clock. `leap_instance` takes those leaps itself, one after another, each
with its own finishes, sample and iteration count, and returns their steps: the same
segments as separate calls, without the SimPy event and engine-loop pass between them.
"""
from __future__ import annotations

import numpy as np

from simserve.policies.sp_leap import LEAP_CAP
from simserve.sim.leap import largest_k

FEW_DECODES = 64  # up to this many decodes, their counts are read one by one (more: numpy)


def leap_instance(eng, cap: int = LEAP_CAP) -> int:
    """`sp_leap.leap_ranks(eng, cap)` for an `engine.XpInstance`, repeated while the engine
    would leap again at once (see the module docstring): the steps of all the leaps taken.

    Nothing else can happen between two such leaps: no request arrives before the clock (the
    next arrival is later), no KV is in flight and nothing is pending (`_leap_ok`), and no
    closed-loop client reacts to a finish (the table's `on_finish` is unset; a client would
    release a slot at the finish's time). So the run loop's next pass would do exactly this."""
    total = 0
    while True:
        k = _leap_once(eng, cap)
        total += k
        if (not k or eng.clock >= eng.ctx.source.next_arrival_s
                or eng.ctx.table.on_finish is not None or not eng._leap_ok()):
            return total


def _leap_once(eng, cap: int) -> int:
    """`sp_leap.leap_ranks(eng, cap)` for an `engine.XpInstance`: the same steps, token times,
    pools and samples. Up to FEW_DECODES decodes, their counts are read and written one by
    one (`_Few`: the same integers as the arrays' arithmetic; numpy calls cost more on a few)."""
    t = eng.ctx.table
    ids, nd, nz, idx = eng._flat_decodes()
    if not nz:
        return 0
    kv = _Few(eng, nd, nz) if len(ids) <= FEW_DECODES else _Many(eng, ids, nd, nz, idx)
    kmax = int(min(kv.steps_left, cap, LEAP_CAP))
    if kmax < 2:
        return 0
    c0, rmax = kv.ctx_sums, kv.ctx_max
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
    # `steps_before(ends, kmax, arrival)`: the same search, through the array's method
    k = min(kmax, 1 + int(ends.searchsorted(arrival, "left")))
    if k < 2:
        return 0
    free = [p.num_free for p in eng.pools]
    grow = kv.new_blocks(k)
    if not all(x <= f for x, f in zip(grow, free)):
        k = largest_k(k, lambda j: all(x <= f for x, f in zip(kv.new_blocks(j), free)))
        if k < 2:
            return 0
        grow = kv.new_blocks(k)
    for p, x in zip(eng.pools, grow):
        if x:   # (allocating none changes nothing)
            p.allocate(x)
    kv.advance(k)
    end = float(ends[k - 1])
    if eng.ctx.recorder.trace is not None:
        eng.trace_ranks(eng.clock, end, k)
    eng.clock = end
    done = t.emit_steps(ids, ends[:k], kv.generated)
    if len(done):
        eng._finish(done)
    eng.ctx.recorder.num_iterations += k
    eng._sample()
    return k


class _Many:
    """The decodes' counts as arrays (gathered once): steps until the first finishes, each
    rank's Σ context and longest context at the first step, new blocks for j steps, and the
    leap's writes."""

    def __init__(self, eng, ids: np.ndarray, nd: list[int], nz: list[int], idx: list[int]):
        t, R = eng.ctx.table, eng.R
        self.t, self.ids, self.nz, self.idx, self.R = t, ids, nz, idx, R
        self.bs = eng.cfg.block_size
        gen = t.generated[ids]
        self.steps_left = int(np.minimum.reduce(t.output[ids] - gen))
        self.generated = gen.tolist()
        self.c = c = t.computed[ids]
        self.held = t.blocks[ids]
        self.ctx_sums, self.ctx_max = [0] * R, [0] * R
        for r, x, m in zip(nz, np.add.reduceat(c, idx).tolist(),
                           np.maximum.reduceat(c, idx).tolist()):
            self.ctx_sums[r], self.ctx_max[r] = x + nd[r], m + 1

    def new_blocks(self, j: int) -> list[int]:
        """Each rank's new blocks for j more tokens per decode."""
        need = [0] * self.R
        nb = (self.c + (j + self.bs - 1)) // self.bs
        nb -= self.held
        np.maximum(nb, 0, out=nb)
        for r, x in zip(self.nz, np.add.reduceat(nb, self.idx).tolist()):
            need[r] = x
        return need

    def advance(self, k: int) -> None:
        """Every decode k tokens on: its blocks max(held, ⌈(c + k)/bs⌉), its tokens c + k."""
        blocks = (self.c + (k + self.bs - 1)) // self.bs
        np.maximum(blocks, self.held, out=blocks)
        self.t.blocks[self.ids] = blocks
        self.t.computed[self.ids] = self.c + k


class _Few:
    """`_Many` for a few decodes, read from the engine's views of the table's int arrays."""

    def __init__(self, eng, nd: list[int], nz: list[int]):
        R = eng.R
        self.eng, self.nz, self.R, self.bs = eng, nz, R, eng.cfg.block_size
        self.lists = lists = eng._flat[0]   # the decode lists of `ids`, rank by rank
        comp, gen_v, out_v = eng._comp, eng._gen, eng._out
        gen, left = [], LEAP_CAP
        sums, maxs = [0] * R, [0] * R
        for r in nz:
            s = m = 0
            for i in lists[r]:
                g = gen_v[i]
                gen.append(g)
                if out_v[i] - g < left:
                    left = out_v[i] - g
                c = comp[i]
                s += c
                if c > m:
                    m = c
            sums[r], maxs[r] = s + nd[r], m + 1
        self.steps_left, self.generated, self.ctx_sums, self.ctx_max = left, gen, sums, maxs

    def new_blocks(self, j: int) -> list[int]:
        comp, held, bs = self.eng._comp, self.eng._held, self.bs
        need = [0] * self.R
        for r in self.nz:
            x = 0
            for i in self.lists[r]:
                b = (comp[i] + j + bs - 1) // bs - held[i]
                if b > 0:
                    x += b
            need[r] = x
        return need

    def advance(self, k: int) -> None:
        comp, held, bs = self.eng._comp, self.eng._held, self.bs
        for r in self.nz:
            for i in self.lists[r]:
                c = comp[i] + k
                b = (c + bs - 1) // bs
                if b > held[i]:
                    held[i] = b
                comp[i] = c
