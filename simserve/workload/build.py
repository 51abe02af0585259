"""`build_workload`: one call from a trace or synthetic name to the requests a run replays.

Order: load -> tile -> first N (from `start`) -> drop over-long requests (`overlong: drop`,
the default) -> arrivals -> or cap at max context (`overlong: cap`). Dropping comes before the
arrival process, so the requests that remain arrive at exactly `rate`. Parsed trace files
are cached per process, keyed by (path, mtime, size), so a sweep over rates parses each file
once, and on disk by content (`simserve.parsed_cache`), so a new process need not parse (nor
import pandas) again; the cached arrays are read-only and every transform returns new arrays.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from pathlib import Path

import numpy as np

from simserve.errors import ConfigError, did_you_mean
from simserve.parsed_cache import cached_parse
from simserve.workload.manifest import load_manifest, resolve_trace
from simserve.workload.readers import read_trace
from simserve.workload.spec import Workload
from simserve.workload.synthetic import (RANDOM, SYNTHETIC, check_count, check_positive,
                                         random_workload)
from simserve.workload.transform import (OVERLONG, cap_context, drop_overlong, first_n,
                                         normalize_exponential, normalize_gamma, scale_gaps,
                                         tile, trace_arrivals, with_max_concurrency,
                                         zero_outputs)

ARRIVALS = ("poisson", "gamma", "scale", "trace")
SYNTHETIC_ARRIVALS = ("poisson", "gamma")
_CACHE_MAX = 8
_cache: OrderedDict[tuple[str, int, int], Workload] = OrderedDict()


def load_trace(path: str | Path) -> Workload:
    """`read_trace` with a small per-process cache keyed by (path, mtime, size)."""
    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    w = cached_parse(path, "trace", read_trace, _encode, _decode)
    for arr in (w.arrival_s, w.prompt_tokens, w.output_tokens):
        arr.flags.writeable = False
    _cache[key] = w
    while len(_cache) > _CACHE_MAX:
        _cache.popitem(last=False)
    return w


_ARRAYS = ("arrival_s", "prompt_tokens", "output_tokens")


def _encode(w: Workload) -> dict:
    """A parsed trace as marshal-able data (see `simserve.parsed_cache`)."""
    d = {f.name: getattr(w, f.name) for f in dataclasses.fields(w)}
    for k in _ARRAYS:
        d[k] = (d[k].dtype.str, d[k].tobytes())
    d["attrs"] = {k: (v.dtype.str, v.tobytes()) for k, v in w.attrs.items()}
    return d


def _decode(d: dict) -> Workload:
    for k in _ARRAYS:
        dtype, data = d[k]
        d[k] = np.frombuffer(data, dtype=dtype)
    d["attrs"] = {k: np.frombuffer(data, dtype=dtype) for k, (dtype, data) in d["attrs"].items()}
    return Workload(**d)


def clear_trace_cache() -> None:
    _cache.clear()


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed: expected an integer >= 0, got {seed!r}")
    return int(seed)


USER_WORKLOAD = "<Workload "  # how a run names a Workload the user passed in (api.py)


def is_trace_file(trace: str) -> bool:
    """Whether `trace` names a trace file (a manifest name or a path), not a generator or a
    Workload the user passed in."""
    return trace not in SYNTHETIC and trace != RANDOM and not trace.startswith(USER_WORKLOAD)


def load_named_trace(trace: str) -> Workload:
    """A trace file (manifest name or path) parsed and named as a run names it: what
    `build_workload(loaded=...)` takes, so that a process that cannot see the file (a worker on
    another machine) builds the same requests from what the submitting process read."""
    path = resolve_trace(trace, also_known=(*SYNTHETIC, RANDOM))
    name = trace if trace in load_manifest() else path.stem
    return dataclasses.replace(load_trace(path), name=name)


def _load(trace: str, num_requests: int | None, seed: int, start: int, random: dict,
          tiles: int = 1, loaded: Workload | None = None,
          zero_output: str = "error") -> Workload:
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
        raise ConfigError(f"start: expected an integer >= 0, got {start!r}")
    if tiles != 1 and (trace in SYNTHETIC or trace == RANDOM):
        raise ConfigError(f"tile: repeats a trace file in time; {trace!r} is synthetic (ask "
                          "for more requests instead)")
    if trace == RANDOM:
        if num_requests is None:
            raise ConfigError(f"num_requests: required for the synthetic workload {trace!r}")
        n = check_count(num_requests)
        w = random_workload(start + n, seed=seed, **random)
        return first_n(w, n, start) if start else w
    if trace in SYNTHETIC:
        if num_requests is None:
            raise ConfigError(f"num_requests: required for the synthetic workload {trace!r}")
        n = check_count(num_requests)
        w = SYNTHETIC[trace].generate(start + n, seed)
        return first_n(w, n, start) if start else w
    w = loaded if loaded is not None else load_named_trace(trace)
    file_rows = w.num_requests
    w = tile(w, tiles)
    if start >= w.num_requests:
        raise ConfigError(f"start: {start} is past the end of {w.name} ({w.num_requests} "
                          "requests)")
    n = w.num_requests - start if num_requests is None else num_requests
    w = first_n(w, n, start)
    # zero-output rows are refused or counted among the requests selected, not the whole file
    return zero_outputs(w, zero_output, (start + np.arange(w.num_requests)) % file_rows)


def build_workload(trace: str, *, num_requests: int | None, arrival: str, rate: float | None,
                   seed: int, burstiness_cv: float = 1.0, max_context: int | None = None,
                   start: int = 0, overlong: str = "drop", random_input_len: int = 1024,
                   random_output_len: int = 128, random_range_ratio: float = 0.0,
                   max_concurrency: int | None = None, tile: int = 1,
                   loaded: Workload | None = None, zero_output: str = "error") -> Workload:
    """Requests for one run.

    trace: a built-in synthetic name (`SYNTHETIC`), `random` (vLLM's random dataset, lengths
    from `random_input_len`, `random_output_len`, `random_range_ratio`), a manifest name, or a
    file path; `tile` repeats a trace file k times in time (`transform.tile`).
    rate: requests/s, or inf to send every request at t = 0 (`vllm bench serve
    --request-rate inf`); max_concurrency: the client's limit on requests in flight.
    arrival: `poisson` (exponential gaps, exact mean rate, fixed by seed), `gamma` (gamma gaps
    with burstiness_cv, exact mean rate), `scale` (the trace's own gaps scaled to `rate`) or
    `trace` (the trace's timestamps from t = 0; rate ignored). Synthetic workloads have no
    timestamps, so only poisson and gamma apply to them.
    overlong: what to do with a request whose prompt + output exceeds `max_context`: `drop`
    it (counted in `num_dropped`) or `cap` it (prompt to max_context - 1, then the output;
    counted in `num_capped`).
    loaded: the trace file already parsed (`load_named_trace(trace)`); it is then not read.
    zero_output: a selected request (after `start`, `num_requests`, `tile`) with 0 output
    tokens is refused (`error`, naming its file line) or counted as one token (`one`;
    `transform.zero_outputs`); rows the run does not select are neither.
    """
    if arrival not in ARRIVALS:
        raise ConfigError(f"arrival: expected one of {', '.join(ARRIVALS)}, got {arrival!r}"
                          f"{did_you_mean(arrival, ARRIVALS)}")
    if (trace in SYNTHETIC or trace == RANDOM) and arrival not in SYNTHETIC_ARRIVALS:
        raise ConfigError(f"arrival: {arrival!r} replays a trace's own timestamps, but "
                          f"{trace!r} is synthetic; use one of {', '.join(SYNTHETIC_ARRIVALS)}")
    if overlong not in OVERLONG:
        raise ConfigError(f"overlong: expected one of {', '.join(OVERLONG)}, got {overlong!r}"
                          f"{did_you_mean(str(overlong), OVERLONG)}")
    seed = _check_seed(seed)
    at_once = False
    if arrival != "trace":
        if rate is None:
            raise ConfigError(f"rate: required for arrival {arrival!r}")
        at_once = isinstance(rate, (int, float, np.number)) and not isinstance(rate, bool) \
            and rate == np.inf
        if not at_once:
            rate = check_positive(rate, "rate")
    w = _load(trace, num_requests, seed, start,
              {"input_len": random_input_len, "output_len": random_output_len,
               "range_ratio": random_range_ratio}, tile, loaded, zero_output)
    if max_context is not None and overlong == "drop":
        w = drop_overlong(w, max_context)
    if at_once:  # every request at t = 0, as vLLM sends them at an infinite rate
        w = dataclasses.replace(w, arrival_s=np.zeros(w.num_requests),
                                meta={**w.meta, "arrival": arrival, "rate": "inf"})
    elif arrival == "poisson":
        w = normalize_exponential(w, rate, seed)
    elif arrival == "gamma":
        w = normalize_gamma(w, rate, burstiness_cv, seed)
    elif arrival == "scale":
        w = scale_gaps(w, rate)
    else:
        w = trace_arrivals(w)
    if max_context is not None and overlong == "cap":
        w = cap_context(w, max_context)
    return with_max_concurrency(w, max_concurrency)
