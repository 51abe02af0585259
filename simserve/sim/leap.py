"""Exact event leaping over decode-only steps, the pieces every engine shares.

A decode-only batch repeats one step with every context one longer; k such steps are priced at
once (`decode_ends`, the same cost-model call a single step makes, so the floats match
stepping), limited to the steps whose KV fits (`largest_k`) and to those that start before the
next arrival could be seen (`steps_before`).
"""
from __future__ import annotations

import math
from bisect import bisect_left
from typing import Callable

import numpy as np


def largest_k(kmax: int, fits: Callable[[int], bool]) -> int:
    """The largest k in [0, kmax] with fits(k), for a fits that only turns false as k grows."""
    if fits(kmax):
        return kmax
    lo, hi = 0, kmax
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def decode_ends(cost, clock: float, computed: np.ndarray, k: int) -> np.ndarray:
    """End times of k consecutive decode steps of the sequences whose KV holds `computed`
    tokens, starting at `clock` (GpuCostModel.decode_only_s with Σ context and the longest)."""
    B = len(computed)
    s0, m0 = int(computed.sum()) + B, int(computed.max()) + 1
    if getattr(type(cost), "decode_steps_s", None) is not None:  # GpuCostModel: fewer calls
        d = cost.decode_steps_s(B, s0, m0, k)
    else:  # wrappers (a real executor's replay) and other cost models
        steps = np.arange(k, dtype=np.int64)
        d = np.array(cost.decode_only_s(B, s0 + B * steps, m0 + steps), dtype=np.float64,
                     ndmin=1)
    # end times: clock + d0, then + d1, ... (cumsum adds in order, as stepping does)
    d[0] += clock
    return np.cumsum(d)


def steps_before(ends: np.ndarray, kmax: int, next_arrival_s: float) -> int:
    """Steps to take: the first, and every later one that starts before the next arrival."""
    return min(kmax, 1 + int(np.searchsorted(ends, next_arrival_s, "left")))


def leap_ends(cost, clock: float, num_decodes: int, ctx_sum0: int, ctx_max0: int, kmax: int,
              next_arrival_s: float, step_hint: float = 0.0) -> list[float]:
    """End times (plain floats) of the steps a leap takes: `decode_ends` of the batch whose
    KV holds Σ ctx_sum0 - B tokens (longest ctx_max0 - 1), cut as `steps_before` cuts it.
    Only about the steps taken are priced (`step_hint`, a recent step's duration, guesses how
    many fit before the arrival; a GpuCostModel prices them with `decode_steps`), so a leap
    that an arrival ends early costs little.
    The same floats as `decode_ends` whatever the guess (tests check)."""
    ends: list[float] = []
    B, e, j0 = num_decodes, float(clock), 0  # a float: numpy scalars add 3x slower
    fast = getattr(type(cost), "decode_steps", None) is not None  # else a wrapper's calls
    n = kmax
    if step_hint > 0.0 and next_arrival_s < math.inf:
        n = max(2, int((next_arrival_s - clock) / step_hint) + 2)
    while j0 < kmax:
        n = min(n, kmax - j0)
        s0, m0 = ctx_sum0 + B * j0, ctx_max0 + j0
        if not fast:
            steps = np.arange(n, dtype=np.int64)
            d = np.atleast_1d(cost.decode_only_s(B, s0 + B * steps, m0 + steps)).tolist()
        else:
            d = cost.decode_steps(B, s0, m0, n)
        a = len(ends)
        e = _append_ends(ends, d, e)  # e + d0, then + d1, ... (in order, as stepping adds)
        if e >= next_arrival_s:  # the steps that start before the arrival, and the next one
            del ends[bisect_left(ends, next_arrival_s, a) + 1:]
            return ends
        j0 += n
        n = max(16, 2 * n)
    return ends


def _append_ends(ends: list[float], d: list[float], e: float) -> float:
    """Append e + d[0], then + d[1], ... to `ends` (each step ends where the last ended plus
    its duration, added in order as stepping adds); returns the last end (e if d is empty)."""
    for x in d:
        e += x
        ends.append(e)
    return e

