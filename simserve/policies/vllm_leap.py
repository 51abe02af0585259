"""A vLLM-family engine's pending leap: decode-only steps priced ahead and applied later.

A leap starts from a batch that is all decoding. Each request i has `r[i]` steps left before
its last token; a leap of K steps gives request i min(K, r[i]) of them. While nobody waits
(and no closed-loop client reacts to finishes) a leap runs on through finishes: the steps are
cut into segments at the step counts where requests finish, each segment a batch of constant
size whose step durations come from the same cost-model call a single step makes, so the
floats are those of stepping (tests check). Otherwise a leap ends at the first finish: a
single segment.

`Segments` holds the batch ordered by steps left, so a segment's batch size, Σ context and
longest context are O(1) each; `new_blocks` counts the KV blocks the steps take.
"""
from __future__ import annotations

import bisect
import dataclasses

import numpy as np


def new_blocks(room: list[int], k: int, bs: int) -> int:
    """KV blocks that k more tokens take beyond the held ones: Σ max(0, ceil((k - room)/bs)),
    i.e. Σ max(0, ceil((computed + k)/bs) - held)."""
    n = 0
    for r in room:  # a plain loop: cheaper than sum() over a generator
        if r < k:
            n -= (r - k) // bs
    return n


def new_blocks_upto(room: list[int], left: list[int], k: int, bs: int) -> int:
    """`new_blocks` when request i takes only min(k, left[i]) of the k steps."""
    n = 0
    for r, s in zip(room, left):
        if r < s and r < k:  # r < min(k, s), tested before taking the min (cheaper)
            n -= (r - (s if s < k else k)) // bs
    return n


def decoding(comp, blocks, ntok, gen, running: list, bs: int):
    """`Leaper`'s check: (contexts, outputs so far, tokens their held KV blocks still fit)
    of a running batch that is all decoding (every request has sampled and has its last
    token's KV to compute), else None."""
    c, g, room = [], [], []
    for i in range(len(running)):
        r = running[i]
        x = comp[r]
        y = gen[r]
        if y == 0 or ntok[r] != x + 1:
            return None
        c.append(x)
        g.append(y)
        room.append(blocks[r] * bs - x)
    return c, g, room


def advance_steps(cv, bv, il: list, c: list, room: list, steps: list, k: int, bs: int,
                   short: list) -> int:
    """A leap commit's loop: request il[i] (context c[i], room[i] tokens left in its held
    blocks) decodes steps[i] steps; its context and blocks grow. Appends to `short` the
    steps of those with fewer than k; returns the new blocks taken (`new_blocks_upto`)."""
    nb = 0
    for i in range(len(il)):
        r = il[i]
        x = c[i]
        a = room[i]
        s = steps[i]
        if s < k:
            short.append(s)
        cv[r] = x + s
        if a < s:  # it needs new blocks: `new_blocks`' term
            nb -= (a - s) // bs
            bv[r] = -(-(x + s) // bs)
    return nb


def _suffix_sum_max(c: list[int], order: list[int]) -> tuple[list[int], list[int]]:
    """Σ and max of c[order[j:]] for each j (0 past the end): `Segments`' batch after the
    requests with the fewest steps left have finished."""
    n = len(order)
    ssum, smax = [0] * (n + 1), [0] * (n + 1)
    s = m = 0
    for j in range(n - 1, -1, -1):
        x = c[order[j]]
        s += x
        if x > m:
            m = x
        ssum[j] = s
        smax[j] = m
    return ssum, smax


class Segments:
    """The batch (contexts `c`, steps left `r`) by steps left: `segment(s0)` is the batch
    that takes step s0 + 1 (the requests with more than s0 steps left)."""

    __slots__ = ("rs", "ssum", "smax", "n")

    def __init__(self, c: list[int], r: list[int]):
        order = sorted(range(len(r)), key=r.__getitem__)
        self.rs = [r[i] for i in order]
        self.n = len(order)
        self.ssum, self.smax = _suffix_sum_max(c, order)

    def segment(self, s0: int) -> tuple[int, int, int, int]:
        """(B, Σ context and longest context at step s0 + 1, the step count after which the
        next request finishes) of the batch after s0 steps; B is 0 once all finished."""
        m = bisect.bisect_right(self.rs, s0)
        B = self.n - m
        if not B:
            return 0, 0, 0, s0
        return B, self.ssum[m] + B * (s0 + 1), self.smax[m] + s0 + 1, self.rs[m]


@dataclasses.dataclass(eq=False, slots=True)
class PendingLeap:
    """A decode-only batch's next steps, priced and not yet applied: `ends` of the steps
    priced so far, from `clock` (with contexts `c`, outputs `g`, KV `room` and steps left `r`
    at the first of them); at most `kmax`; `own`: the next time one of the engine's own
    requests can reach its queue (a step ending at or after it is the last); `open`: priced
    only up to an arrival that may go to another engine; `more`: priced up to a horizon only
    (nothing bounds it yet); `delivered`: when clients receive the first steps' tokens (their
    output work was submitted to the front end ahead of a front-end event). `after`: the steps
    it goes on past the first one ending at or after `own` (1 under async scheduling: the
    engine had scheduled that step before the request reached it, so stepping decodes it
    without the request), and `reach_step`, that first step once the leap goes on past it.

    Segments: `starts[j]` is the step index where segment j begins and `sizes[j]` its batch
    size (priced segments only); the current (last) one's Σ context and longest context at
    its first step are `seg_sum`, `seg_max`, and it ends after step `seg_end`. `segs` is None
    for a leap that stops at its first finish."""
    ids: np.ndarray
    c: list
    g: list
    room: list
    r: list
    clock: float
    kmax: int
    own: float
    seg_sum: int
    seg_max: int
    seg_end: int
    segs: Segments | None = None
    starts: list = dataclasses.field(default_factory=lambda: [0])
    sizes: list = dataclasses.field(default_factory=list)
    ends: list = dataclasses.field(default_factory=list)
    open: bool = False
    more: bool = False
    delivered: list = dataclasses.field(default_factory=list)  # clients' times, first steps
    after: int = 0
    reach_step: int = 0

    @property
    def B(self) -> int:
        """The batch at the leap's first step."""
        return self.sizes[0]

    def next_segment(self) -> bool:
        """Move pricing to the segment after the current one's finishes (False: none left)."""
        if self.segs is None:
            return False
        B, s, m, end = self.segs.segment(self.seg_end)
        if not B:
            return False
        self.starts.append(self.seg_end)
        self.sizes.append(B)
        self.seg_sum, self.seg_max, self.seg_end = s, m, min(end, self.kmax)
        return True

    def finished_before(self, now: float) -> int:
        """Requests whose last step ends before `now` (stepping has removed them by then)."""
        n, ends = 0, self.ends
        for j in range(1, len(self.starts)):
            if ends[self.starts[j] - 1] >= now:
                break
            n += self.sizes[j - 1] - self.sizes[j]
        return n

    def cut(self, k: int) -> None:
        """Keep only the first k priced steps."""
        del self.ends[k:]
        while self.starts[-1] >= k and len(self.starts) > 1:
            self.starts.pop()
            self.sizes.pop()
        self.kmax = k
