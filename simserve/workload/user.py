"""A `Workload` built by the user (a notebook's own request list), run with the workload
options that apply to one: `num_requests` and `start` (which of its requests), `tile`
(repeated in time) and `max_concurrency` (a closed-loop client). The others describe how
simserve would *make* requests (trace, rates, arrival, lengths) and are refused, never
ignored: the Workload's requests and arrival times are its own."""
from __future__ import annotations

import math

import numpy as np

from simserve.errors import ConfigError
from simserve.workload.spec import Workload
from simserve.workload.transform import first_n, tile, with_max_concurrency

HONOURED = ("num_requests", "start", "tile", "max_concurrency")
NEUTRAL = ("seed", "seeds")  # a point's seed: the policy's randomness, not the requests'


def refuse_other_options(keys, where: str = "") -> None:
    """A one-line error for the first key that does not apply to a user's Workload."""
    bad = [k for k in keys if k not in HONOURED + NEUTRAL]
    if bad:
        raise ConfigError(f"{where}{bad[0]}: does not apply to a Workload you pass (its "
                          f"requests and arrival times are its own); the options that do: "
                          f"{', '.join(HONOURED)}")


def apply_options(w: Workload, *, num_requests: int | None = None, start: int = 0,
                  tiles: int = 1, max_concurrency: int | None = None) -> Workload:
    """`w` tiled `tiles` times, then requests start .. start+num_requests-1 (all from `start`
    when num_requests is None), with the client's limit `max_concurrency` (kept from `w`
    when None)."""
    if not isinstance(w, Workload):
        raise ConfigError(f"workload: expected a simserve Workload, got {type(w).__name__}")
    w = tile(w, tiles)
    if start or num_requests is not None:
        w = first_n(w, w.num_requests - start if num_requests is None else num_requests, start)
    return with_max_concurrency(w, max_concurrency)


def mean_rate(w: Workload) -> float:
    """Requests per second over the Workload's arrival span ((n-1) gaps); inf when every
    request arrives at once (as `rates: [inf]` sends them)."""
    a = np.asarray(w.arrival_s, dtype=np.float64)
    span = float(a[-1] - a[0]) if len(a) > 1 else 0.0
    return (len(a) - 1) / span if span > 0 else math.inf
