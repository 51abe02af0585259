"""Workload transforms: first-N, arrival normalisation, gap scaling, context caps.

Each returns a new Workload; inputs are never modified.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from simserve.errors import ConfigError, TraceFormatError
from simserve.workload.spec import Workload
from simserve.workload.synthetic import (arrival_rng, check_count, check_positive,
                                         gamma_arrivals)


def _with_arrivals(w: Workload, arrival_s: np.ndarray, **meta) -> Workload:
    return dataclasses.replace(w, arrival_s=np.asarray(arrival_s, dtype=np.float64),
                               meta={**w.meta, **meta})


def first_n(w: Workload, n: int, start: int = 0) -> Workload:
    """Requests start .. start+n-1 in file order (arrival times unchanged)."""
    n = check_count(n, "num_requests")
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
        raise ConfigError(f"start: expected an integer >= 0, got {start!r}")
    if start + n > w.num_requests:
        raise ConfigError(f"num_requests: asked for requests {start}..{start + n - 1} but "
                          f"{w.name} has only {w.num_requests}")
    sl = slice(start, start + n)
    return dataclasses.replace(w, arrival_s=w.arrival_s[sl].copy(),
                               prompt_tokens=w.prompt_tokens[sl].copy(),
                               output_tokens=w.output_tokens[sl].copy(),
                               hash_ids=None if w.hash_ids is None else w.hash_ids[sl],
                               attrs={k: v[sl].copy() for k, v in w.attrs.items()},
                               meta={**w.meta, "start": int(start)})


def tile(w: Workload, k: int) -> Workload:
    """The trace repeated k times in time: copy j is shifted by j periods, a period being the
    trace's span plus one mean gap, (n/(n−1))·(last − first), so the tiled trace keeps the
    trace's mean rate and no two copies overlap."""
    k = check_count(k, "tile")
    if k == 1:
        return w
    n = _nonempty(w)
    a = np.asarray(w.arrival_s, dtype=np.float64)
    span = float(a[-1] - a[0]) if n > 1 else 0.0
    if span <= 0:
        raise ConfigError(f"tile: {w.name} has no duration (all arrivals simultaneous), so its "
                          "copies cannot be laid end to end")
    period = span * n / (n - 1)
    arr = (a[None, :] + period * np.arange(k, dtype=np.float64)[:, None]).ravel()
    return dataclasses.replace(w, arrival_s=arr, prompt_tokens=np.tile(w.prompt_tokens, k),
                               output_tokens=np.tile(w.output_tokens, k),
                               attrs={name: np.tile(v, k) for name, v in w.attrs.items()},
                               meta={**w.meta, "tile": int(k), "tile_period_s": period})


def _nonempty(w: Workload) -> int:
    if w.num_requests < 1:
        raise ConfigError(f"{w.name}: the workload has no requests")
    return w.num_requests


def _exact_rate(gaps: np.ndarray, rate: float) -> np.ndarray:
    """Rescale gaps so their mean is exactly 1/rate; arrivals start at t = 0."""
    if gaps.size == 0:
        return np.zeros(1)
    total = gaps.sum()
    if total <= 0:
        raise ConfigError("all arrivals are simultaneous: cannot rescale to a rate")
    return np.concatenate(([0.0], np.cumsum(gaps * (gaps.size / (total * rate)))))


def normalize_exponential(w: Workload, rate: float, seed: int) -> Workload:
    """Replace arrivals by exponential gaps drawn from `arrival_rng(seed)`, rescaled so the
    mean gap is exactly 1/rate (DualPace §6.1). The draws depend on the seed only: another
    rate rescales the same gaps."""
    rate = check_positive(rate, "rate")
    gaps = arrival_rng(seed).standard_exponential(_nonempty(w) - 1)
    return _with_arrivals(w, _exact_rate(gaps, rate), arrival="poisson", rate=rate,
                          seed=int(seed))


def normalize_gamma(w: Workload, rate: float, cv: float, seed: int) -> Workload:
    """Like `normalize_exponential` with gamma gaps of coefficient of variation cv."""
    rate = check_positive(rate, "rate")
    gaps = np.diff(gamma_arrivals(_nonempty(w), 1.0, cv, arrival_rng(seed)))
    return _with_arrivals(w, _exact_rate(gaps, rate), arrival="gamma", rate=rate,
                          burstiness_cv=float(cv), seed=int(seed))


def scale_gaps(w: Workload, rate: float) -> Workload:
    """Keep the trace's own gaps, scaled uniformly so (n-1)/(last-first) == rate
    (ConfluxServe §8.1). First arrival at t = 0."""
    rate = check_positive(rate, "rate")
    if w.num_requests < 2:
        return _with_arrivals(w, np.zeros(w.num_requests), arrival="scale", rate=rate)
    rel = w.arrival_s - w.arrival_s[0]
    if rel[-1] <= 0:
        raise ConfigError(f"{w.name}: all {w.num_requests} arrivals are simultaneous, "
                          "so its gaps cannot be scaled to a rate; use arrival 'poisson'")
    factor = (w.num_requests - 1) / (rel[-1] * rate)
    return _with_arrivals(w, rel * factor, arrival="scale", rate=rate)


def trace_arrivals(w: Workload) -> Workload:
    """The trace's own timestamps, shifted so the first arrival is at t = 0."""
    rel = w.arrival_s - w.arrival_s[0] if w.num_requests else w.arrival_s
    return _with_arrivals(w, rel, arrival="trace")


OVERLONG = ("drop", "cap")


def _check_max_context(max_context) -> None:
    if isinstance(max_context, bool) or not isinstance(max_context, (int, np.integer)) \
            or max_context < 2:
        raise ConfigError(f"max_context: expected an integer >= 2, got {max_context!r}")


def drop_overlong(w: Workload, max_context: int) -> Workload:
    """Leave out every request with prompt + output > max_context, as a vLLM server rejects
    one whose prompt plus `max_tokens` exceeds `max_model_len` ("This model's maximum context
    length is ..."). `num_dropped` counts them; the rest keep their order (and hash_ids)."""
    _check_max_context(max_context)
    keep = (w.prompt_tokens + w.output_tokens) <= max_context
    dropped = int((~keep).sum())
    meta = {**w.meta, "max_context": int(max_context), "overlong": "drop"}
    if not dropped:
        return dataclasses.replace(w, num_dropped=0, meta=meta)
    if not keep.any():
        raise ConfigError(f"{w.name}: all {w.num_requests} requests exceed max_context "
                          f"{max_context} (overlong: drop); raise max_context or use "
                          "overlong: cap")
    idx = np.flatnonzero(keep)
    return dataclasses.replace(
        w, arrival_s=w.arrival_s[idx], prompt_tokens=w.prompt_tokens[idx],
        output_tokens=w.output_tokens[idx], num_dropped=dropped, meta=meta,
        hash_ids=None if w.hash_ids is None else tuple(w.hash_ids[i] for i in idx),
        attrs={k: v[idx] for k, v in w.attrs.items()})


def cap_context(w: Workload, max_context: int) -> Workload:
    """Make prompt + output <= max_context: cap the prompt at max_context - 1, then the output
    at max_context - prompt. `num_capped` counts the requests this changed. (A capped prompt
    keeps its hash_ids: only the blocks inside the capped prompt are ever looked up.)"""
    _check_max_context(max_context)
    prompt = np.minimum(w.prompt_tokens, max_context - 1)
    output = np.minimum(w.output_tokens, max_context - prompt)
    changed = (prompt != w.prompt_tokens) | (output != w.output_tokens)
    return dataclasses.replace(w, prompt_tokens=prompt, output_tokens=output,
                               num_capped=int(changed.sum()),
                               meta={**w.meta, "max_context": int(max_context)})


ZERO_OUTPUT = ("error", "one")


def zero_outputs(w: Workload, mode: str = "error", rows=None) -> Workload:
    """A trace's requests with 0 output tokens: `error` refuses the trace, naming the first such
    request's file and line; `one` counts each as one token (the first token every request
    produces, as vLLM's server returns it), the count kept in `meta["num_zero_output"]`.
    `rows`: each request's row in the file (a selection of it, `start` / `num_requests` /
    `tile`); None: request i is row i. Only the requests in `w` are refused or counted."""
    if mode not in ZERO_OUTPUT:
        raise ConfigError(f"zero_output: expected one of {', '.join(ZERO_OUTPUT)}, got "
                          f"{mode!r}")
    out = np.asarray(w.output_tokens)
    zero = out == 0
    n = int(zero.sum())
    if not n:
        return w if w.meta.get("num_zero_output", 0) == 0 else \
            dataclasses.replace(w, meta={**w.meta, "num_zero_output": 0})
    if mode == "error":
        where = w.meta.get("source", w.name)
        first = int(np.argmax(zero))
        line = _line_of(w.meta, first if rows is None else int(rows[first]))
        at = f"{where}:{line}" if line else f"{where}: request {first}"
        raise TraceFormatError(f"{at}: output length of 0 tokens ({n} such "
                               "requests); set workload.zero_output: one to count each as one "
                               "token")
    return dataclasses.replace(w, output_tokens=np.where(zero, 1, out).astype(np.int64),
                               meta={**w.meta, "num_zero_output": n})


def _line_of(meta: dict, row: int) -> int | None:
    """The file line of zero-output row `row`, as the reader recorded it (None: not known)."""
    lines = dict(zip(meta.get("zero_output_rows", ()), meta.get("zero_output_lines", ())))
    return int(lines[row]) if row in lines else None


def with_max_concurrency(w: Workload, max_concurrency: int | None) -> Workload:
    """`w` replayed as a closed loop of at most `max_concurrency` requests in flight (None
    keeps `w`'s own); a bad value is a ConfigError."""
    if max_concurrency is None:
        return w
    try:
        return dataclasses.replace(w, max_concurrency=max_concurrency)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
