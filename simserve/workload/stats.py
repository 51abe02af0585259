"""Summary statistics of a workload, computed as in `../shared/traces/README.md`:
numpy's default (linear) percentiles, duration = last - first arrival, mean arrival rate =
requests / duration."""
from __future__ import annotations

import math

import numpy as np

from simserve.workload.spec import Workload


def trace_stats(w: Workload) -> dict:
    """Requests, input/output length summaries, duration and mean arrival rate."""
    if w.num_requests == 0:
        return {"name": w.name, "requests": 0}
    p = w.prompt_tokens.astype(np.float64)
    o = w.output_tokens.astype(np.float64)
    duration = float(w.arrival_s[-1] - w.arrival_s[0])
    return {
        "name": w.name,
        "requests": w.num_requests,
        "input_mean": float(p.mean()),
        "input_median": float(np.percentile(p, 50)),
        "input_p95": float(np.percentile(p, 95)),
        "input_p99": float(np.percentile(p, 99)),
        "input_max": int(w.prompt_tokens.max()),
        "input_total": int(w.prompt_tokens.sum()),
        "output_mean": float(o.mean()),
        "output_median": float(np.percentile(o, 50)),
        "output_p95": float(np.percentile(o, 95)),
        "output_max": int(w.output_tokens.max()),
        "output_total": int(w.output_tokens.sum()),
        "duration_s": duration,
        "mean_rate": w.num_requests / duration if duration > 0 else math.nan,
        "num_capped": int(w.num_capped),
        "num_dropped": int(w.num_dropped),
    }


_LABELS = {
    "requests": ("requests", "{:,}"),
    "input_mean": ("input mean", "{:,.1f}"),
    "input_median": ("input median", "{:,.1f}"),
    "input_p95": ("input P95", "{:,.1f}"),
    "input_p99": ("input P99", "{:,.1f}"),
    "input_max": ("input max", "{:,}"),
    "input_total": ("input total", "{:,}"),
    "output_mean": ("output mean", "{:,.1f}"),
    "output_median": ("output median", "{:,.1f}"),
    "output_p95": ("output P95", "{:,.1f}"),
    "output_max": ("output max", "{:,}"),
    "output_total": ("output total", "{:,}"),
    "duration_s": ("duration (s)", "{:,.1f}"),
    "mean_rate": ("mean arrival rate (req/s)", "{:.3f}"),
    "num_capped": ("capped at max context", "{:,}"),
    "num_dropped": ("dropped (over max context)", "{:,}"),
}


def format_stats(d: dict) -> str:
    """`trace_stats` output as aligned 'label  value' lines (unknown keys printed as is)."""
    rows = [("trace", str(d["name"]))] if "name" in d else []
    for key, value in d.items():
        if key == "name":
            continue
        label, fmt = _LABELS.get(key, (key, "{}"))
        rows.append((label, fmt.format(value)))
    lw = max(len(label) for label, _ in rows)
    vw = max(len(value) for _, value in rows)
    return "\n".join(f"{label:<{lw}}  {value:>{vw}}" for label, value in rows)
