"""Decode-only step times of LoongServe's instances, kept per decode layout.

Between two events (an arrival, a prefill, a finish) the instances repeat a decode step with
every context one longer, and leaps, stepped decode iterations, the TBT cap and the steps run
beside a prefill all ask for the times of such steps. `SpCostModel.decode_steps_s` prices them
from its cached per-rank attention lines but redoes the rest (the ranks' maximum, the launch
model, LM head and host time) on every call; `StepTimes` keeps its answers per layout
instead (`decode_steps_s` of a run of steps, each step's float independent of the run it is
priced in), so that a repeated question is a slice of a kept array.

A layout is what fixes the times of its steps: each busy rank's decode count b, Σ context −
b · longest (constant as both grow), and its longest context relative to the first busy
rank's. A line holds the step times by that rank's longest context. Ranks without decodes do
not count (a step's time takes the maximum over the busy ranks, and their linear time is 0):
the instances that keep decoding beside a prefill share the line of the same decodes before
it. Tests check the times against `decode_steps_s`'s.
"""
from __future__ import annotations

import numpy as np

from simserve.cost.sp import SpCostModel

FIRST = 16         # steps priced when a line is started for at most this many: most layouts
#                    last a few steps (an arrival or a finish ends them), and a few are priced
#                    cheaply (plain floats)
LOOKAHEAD = 256    # steps priced when a line is started for more, or extended (at least)
MAX_LINES = 4096    # layouts kept before the cache starts over


class StepTimes:
    """Step times (s) of decode-only iterations on `cost`'s ranks (`cost.decode_steps_s`, as
    the engine executes with it), kept per layout."""

    def __init__(self, cost: SpCostModel):
        self.cost = cost
        self._lines: dict = {}  # layout -> (first position, times from there on)

    def steps_s(self, n_d, c0, m0, lo: int, n: int) -> np.ndarray:
        """`cost.decode_steps_s(n_d, c0, m0, lo, n)`: steps lo .. lo + n − 1 after a step whose
        ranks hold n_d decodes with Σ context c0 and longest m0 (Python ints)."""
        busy = [r for r, b in enumerate(n_d) if b > 0]
        if not busy:
            return np.zeros(n)
        ref = m0[busy[0]]
        key = tuple((n_d[r], c0[r] - n_d[r] * m0[r], m0[r] - ref) for r in busy)
        i = ref + lo  # the first busy rank's longest context at step lo: the line's position
        e = self._lines.get(key)
        if e is not None and e[0] <= i:
            p0, vals = e
            if i + n > p0 + len(vals):  # extend the line
                if i - p0 > 4 * LOOKAHEAD:  # drop what is behind
                    vals, p0 = vals[i - p0:], i
                end = p0 + len(vals)
                more = self._price(n_d, c0, m0, end - ref, max(i + n - end, LOOKAHEAD))
                vals = np.concatenate((vals, more))
                self._lines[key] = (p0, vals)
            return vals[i - p0:i - p0 + n]
        if len(self._lines) > MAX_LINES:
            self._lines.clear()
        vals = self._price(n_d, c0, m0, lo, FIRST if n <= FIRST else max(n, LOOKAHEAD))
        self._lines[key] = (i, vals)
        return vals[:n]

    def step_s(self, n_d, c0, m0) -> float:
        """One step (`decode_steps_s(..., 0, 1)[0]`, as a Python float)."""
        return float(self.steps_s(n_d, c0, m0, 0, 1)[0])

    def _price(self, n_d, c0, m0, lo: int, n: int) -> np.ndarray:
        return np.asarray(self.cost.decode_steps_s(n_d, c0, m0, lo, n), dtype=np.float64)
