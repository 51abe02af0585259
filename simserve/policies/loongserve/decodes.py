"""The decode side of LoongServe's instances, over plain ints.

`SpRanksEngine` keeps its decodes' bookkeeping (KV growth, each rank's Σ context and longest)
in numpy over the request table. LoongServe runs few decodes at a time, most of them on one
instance (scale-down consolidates them), where numpy's per-call cost exceeds the arithmetic:
`DecodeRanks` gathers the decodes' numbers once per use as Python ints, prices decode-only
steps from `StepTimes` (kept per layout), and runs the back-to-back decode steps of the
instances that keep decoding beside a prefill. The same blocks, contexts and step times as
the numpy paths (the leap-vs-step tests check).
"""
from __future__ import annotations

import numpy as np

from simserve.policies.loongserve.steps import StepTimes
from simserve.policies.sp_ranks import SpRanksEngine
from simserve.sim.leap import largest_k


class DecodeRanks(SpRanksEngine):
    """`SpRanksEngine` with its decode bookkeeping over plain ints and decode-only step times
    kept per layout (`step_times`)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.step_times = StepTimes(self.cost)  # decode-only step times, kept per layout
        self.step_hint = 0.0  # a recent leap's mean step time (sizes the next one's pricing)
        self._state = None    # this iteration's `_decode_state()`

    def _grow_decodes(self) -> None:
        """`SpRanksEngine._grow_decodes`: when every rank's decodes fit their next KV slot
        (the usual case), in plain ints (the same blocks); else its rank-by-rank path."""
        t, bs, decodes = self.ctx.table, self.cfg.block_size, self.decodes
        n = sum(map(len, decodes))
        if n:
            ids = np.fromiter((i for a in decodes for i in a), dtype=np.int64, count=n)
            held = t.blocks[ids].tolist()
            nb = [d if (d := -(-(x + 1) // bs) - h) > 0 else 0  # max(0, d) without the call
                  for x, h in zip(t.computed[ids].tolist(), held)]
            need, j = [], 0
            for a in decodes:
                need.append(sum(nb[j:j + len(a)]))
                j += len(a)
            if all(x <= p.num_free for x, p in zip(need, self.pools)):
                for x, p in zip(need, self.pools):
                    p.allocate(x)
                t.blocks[ids] = [h + b for h, b in zip(held, nb)]
                return
        super()._grow_decodes()

    def _decode_state(self) -> tuple[list[int], list[int], list[int]]:
        """Per rank: decodes, their Σ context and the longest (tokens in KV plus the new one;
        0 without decodes), as `_rank_states` and `_rank_max` give them, from one gather;
        kept as the iteration's `_state`."""
        t, decodes = self.ctx.table, self.decodes
        nd = [len(a) for a in decodes]
        if not any(nd):
            self._state = nd, [0] * self.R, [0] * self.R
            return self._state
        c = t.computed[np.fromiter((i for a in decodes for i in a), dtype=np.int64,
                                   count=sum(nd))].tolist()
        dctx, dmax, j = [], [], 0
        for n in nd:
            dctx.append(sum(c[j:j + n]) + n)
            dmax.append(max(c[j:j + n]) + 1 if n else 0)
            j += n
        self._state = nd, dctx, dmax
        return self._state

    def _decode_steps_within(self, nd, dctx, span: float):
        """(end offsets, ids) of back-to-back decode steps, within `span`, on the instances that
        keep decoding; their KV for those steps is reserved here (a step that does not fit is
        not run). Step times from the cached layout's line (`StepTimes`, `decode_steps_s`'s
        floats, each as stepping prices it), summed one by one as a cumulative sum adds them."""
        t, bs = self.ctx.table, self.cfg.block_size
        keep = [r for r in range(self.R) if nd[r] > 0]
        if not keep:
            return np.zeros(0), None
        dmax = self._state[2]
        sub_nd = [nd[r] for r in keep]
        sub_c, sub_m = [dctx[r] for r in keep], [dmax[r] for r in keep]
        ids = np.fromiter((i for r in keep for i in self.decodes[r]), dtype=np.int64,
                          count=sum(sub_nd))
        c, held = t.computed[ids].tolist(), t.blocks[ids].tolist()
        left = min(o - g for o, g in zip(t.output[ids].tolist(), t.generated[ids].tolist()))
        per, j = [], 0  # each kept rank's (tokens in KV, blocks held)
        for n in sub_nd:
            per.append(list(zip(c[j:j + n], held[j:j + n])))
            j += n

        def extra(s: int) -> list[int]:  # per kept rank: blocks beyond those held for s steps
            return [sum(d for x, h in p if (d := -(-(x + s) // bs) - h) > 0) for p in per]

        # step j runs if it fits KV for j + 1 tokens (step 0's is held), j < left, and the
        # steps before it end within the span. The span is found first, then the KV checked
        # for that many steps (fewer if they do not fit: the fit only fails as steps grow, so
        # this is the largest count that fits cut at the span, as checking first would give)
        free = [self.pools[r].num_free for r in keep]

        def fits(s: int) -> bool:
            return s <= 1 or all(x <= f for x, f in zip(extra(s), free))

        ends = []
        if span > 0.0:
            e, lo, n = 0.0, 0, 16
            if self.step_hint > 0.0 and span < self.step_hint * left:
                n = max(2, int(span / self.step_hint) + 2)
            while lo < left:
                n = min(n, left - lo)
                for d in self.step_times.steps_s(sub_nd, sub_c, sub_m, lo, n).tolist():
                    e += d
                    ends.append(e)
                    if e >= span:  # the next step would start at or after the span's end
                        break
                else:
                    lo, n = lo + n, 2 * n
                    continue
                break
        count = len(ends)
        if not fits(count):
            count = largest_k(count, fits)
            del ends[count:]
        for r, x in zip(keep, extra(count)):
            self.pools[r].allocate(x)
        t.blocks[ids] = [h if h >= (b := -(-(x + count) // bs)) else b for h, x in zip(held, c)]
        return np.asarray(ends, dtype=np.float64), ids
