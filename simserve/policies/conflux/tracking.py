"""How well ConfluxServe's estimator predicted the iterations it dispatched prefill into
(a mechanism counter): the estimate Alg. 1 planned against, beside the time the
cost model (the "hardware") then charged. Decode-only iterations are left out: no dispatch
decision rests on their estimate."""
from __future__ import annotations

import numpy as np


class EstimatorTracker:
    """Actual and estimated seconds of every iteration that dispatched prefill, and τ."""

    def __init__(self, tau_s: float):
        self.tau_s = float(tau_s)
        self.actual: list[float] = []
        self.estimate: list[float] = []

    def add(self, actual_s: float, estimate_s: float) -> None:
        self.actual.append(float(actual_s))
        self.estimate.append(float(estimate_s))

    def summary(self) -> dict:
        """Flat keys for a run's summary: MAPE (|actual − estimate| / actual), bias
        ((actual − estimate) / estimate, > 0: the estimator under-predicts, as
        `fit.estimator_errors`), the share of these iterations longer than τ and their p99 / τ.
        NaN when no iteration dispatched prefill (the runner sums counters: no None)."""
        n = len(self.actual)
        keys = ("conflux_estimator_mape", "conflux_estimator_bias",
                "conflux_prefill_iter_over_tau_share", "conflux_p99_prefill_iter_over_tau")
        out = {"conflux_num_prefill_iterations": n}
        if n == 0:
            out.update(dict.fromkeys(keys, float("nan")))
            return out
        a, e = np.asarray(self.actual), np.asarray(self.estimate)
        vals = (float(np.mean(np.abs(a - e) / a)), float(np.mean((a - e) / e)),
                float(np.mean(a > self.tau_s)), float(np.percentile(a, 99)) / self.tau_s)
        out.update(zip(keys, vals))
        return out
