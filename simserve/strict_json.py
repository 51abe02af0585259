"""Strict JSON for run records (no bare NaN or Infinity), as `vllm bench` tooling reads them."""
from __future__ import annotations

import math


def strict_json(v):
    """`v` with no bare NaN or Infinity (strict JSON): NaN -> null, ±inf -> "inf" / "-inf"
    (vLLM writes an infinite request_rate as "inf")."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: strict_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [strict_json(x) for x in v]
    return v


def from_strict_json(record: dict) -> dict:
    """Undo `strict_json` on one record in place: null numbers -> NaN, "inf" -> inf."""
    for k, v in record.items():
        if v is None and (k.endswith(("_ms", "_s")) or k in _NUMERIC):
            record[k] = math.nan
        elif v in ("inf", "-inf"):
            record[k] = float(v)
    return record


_NUMERIC = ("request_throughput", "output_throughput", "total_token_throughput", "duration",
            "request_goodput", "slo_goodput", "slo_attainment")
