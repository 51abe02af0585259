"""Exact event leaping over LoongServe's decode-only steps, in plain Python numbers.

`sp_leap.leap_ranks` with LoongServe's few decodes (most of them on one instance: scale-down
consolidates them) in mind: the decodes' contexts and blocks are read once as Python ints, the
KV fit is checked per rank with integer sums, the step times come from the engine's per-layout
cache (`StepTimes`, `decode_steps_s`'s floats) and the end times are summed one by one, as
`np.cumsum` adds them. The same steps, blocks and token times as `leap_ranks` (tests check).
"""
from __future__ import annotations

import numpy as np

from simserve.policies.sp_leap import LEAP_CAP
from simserve.sim.leap import largest_k


def leap_layout(eng, cap: int = LEAP_CAP) -> int:
    """Leap the engine's ranks over as many decode-only steps as fit before the next arrival,
    at most `cap` (at least 2; 0: step instead)."""
    t, bs, decodes = eng.ctx.table, eng.cfg.block_size, eng.decodes
    nd = [len(a) for a in decodes]
    if not any(nd):
        return 0
    ids = np.fromiter((i for a in decodes for i in a), dtype=np.int64, count=sum(nd))
    c, held = t.computed[ids].tolist(), t.blocks[ids].tolist()
    g = t.generated[ids].tolist()
    kmax = min(min(o - x for o, x in zip(t.output[ids].tolist(), g)), cap, LEAP_CAP)
    per, c0, m0, j = [], [], [], 0  # per rank: (tokens in KV, blocks held), Σ context, longest
    for n in nd:
        cr = c[j:j + n]
        per.append(list(zip(cr, held[j:j + n])))
        c0.append(sum(cr) + n)
        m0.append(max(cr) + 1 if n else 0)
        j += n
    free = [p.num_free for p in eng.pools]

    def new_blocks(k: int) -> list[int]:
        return [sum(d for x, h in p if (d := -(-(x + k) // bs) - h) > 0) for p in per]

    def fits(k: int) -> bool:
        return all(x <= f for x, f in zip(new_blocks(k), free))

    if kmax < 2:
        return 0
    arrival = eng.ctx.source.next_arrival_s
    # end times: the clock plus each step's time, added one by one (as np.cumsum adds),
    # up to the first step that ends at or after the next arrival. Steps are asked for in
    # doubling runs from a guess of how many fit before the arrival (the last leap's step
    # time), so that a new layout's line is priced about as long as it is used (the times
    # do not depend on the runs)
    ends, e, lo, n = [], eng.clock, 0, 16
    if eng.step_hint > 0.0 and arrival - e < eng.step_hint * kmax:
        n = max(2, int((arrival - e) / eng.step_hint) + 2)
    while lo < kmax:
        n = min(n, kmax - lo)
        for d in eng.step_times.steps_s(nd, c0, m0, lo, n).tolist():
            e += d
            ends.append(e)
            if e >= arrival:
                break
        else:
            lo, n = lo + n, 2 * n
            continue
        break
    # the KV checked for the steps found (fewer if they do not fit: the fit only fails as
    # steps grow, so this is the largest count that fits cut at the arrival, as checking
    # first would give)
    k = len(ends)
    if k < 2:
        return 0
    blocks = new_blocks(k)
    if not all(x <= f for x, f in zip(blocks, free)):
        k = largest_k(k, fits)
        if k < 2:
            return 0
        del ends[k:]
        blocks = new_blocks(k)
    for p, x in zip(eng.pools, blocks):
        p.allocate(x)
    t.blocks[ids] = [h if h >= (b := -(-(x + k) // bs)) else b for h, x in zip(held, c)]
    t.computed[ids] = [x + k for x in c]
    if eng.ctx.recorder.trace is not None:
        eng.trace_ranks(eng.clock, ends[k - 1], k)
    eng.step_hint = (ends[k - 1] - eng.clock) / k
    eng.clock = ends[k - 1]
    # emit_many of the first k - 1 steps and emit of the last (every decode has its first
    # token, as emit_steps asks of the counts it is handed)
    done = t.emit_steps(ids, ends, g)
    if len(done):
        eng._finish(done)
    eng.ctx.recorder.num_iterations += k
    eng._sample()
    return k
