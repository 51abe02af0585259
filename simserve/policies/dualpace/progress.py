"""Token progress over time (DualPace Fig. 1): cumulative generated tokens and cumulative
CPU-resident decoded tokens, from a run's per-token times and residency."""
from __future__ import annotations

import numpy as np

from simserve.sim.records import RequestRecords


def token_progress(records: RequestRecords, times_s=None) -> dict[str, np.ndarray]:
    """Cumulative counts at `times_s` (default: every distinct token time, sorted).

    Returns {"t_s", "tokens_total", "tokens_cpu"}: tokens generated at or before each time,
    and those of them decoded by a CPU engine (all zero when the run tracked no residency)."""
    tt = records.token_times_s
    ok = ~np.isnan(tt)
    t_all = np.sort(tt[ok])
    cpu = records.token_on_cpu
    t_cpu = np.sort(tt[ok & cpu]) if cpu is not None else np.zeros(0)
    t = np.unique(t_all) if times_s is None else np.asarray(times_s, dtype=np.float64)
    return {"t_s": t,
            "tokens_total": np.searchsorted(t_all, t, side="right"),
            "tokens_cpu": np.searchsorted(t_cpu, t, side="right")}


def cpu_progress_stalls(records: RequestRecords, min_gap_s: float) -> np.ndarray:
    """Gaps (s) longer than `min_gap_s` between consecutive CPU-decoded tokens while CPU
    tokens were still to come: the plateaus of Fig. 1 (top right)."""
    if records.token_on_cpu is None:
        return np.zeros(0)
    t = np.sort(records.token_times_s[records.token_on_cpu])
    g = np.diff(t)
    return g[g > min_gap_s]
