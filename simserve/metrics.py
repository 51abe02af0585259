"""Serving metrics from `RequestRecords`: per-request frame, vllm-style summary, rate curves.

Definitions, symbols and the papers' conventions are in `docs/metrics.md`. Everything is
vectorised over the flattened token array; nothing here loops over requests or tokens.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simserve.sim.records import RequestRecords

if TYPE_CHECKING:
    import pandas as pd

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True, slots=True)
class SLO:
    """Two forms, any subset of the four thresholds (milliseconds):

    - simserve's per-token deadlines (ConfluxServe), `{ttft_ms, tbt_ms}`: token k of request i
      is due at a_i + ttft + (k-1)·tbt; `slo_attainment` is the share of requests that met
      every deadline, `slo_goodput` those per second;
    - vLLM's (`vllm bench serve --goodput ttft:X tpot:Y e2el:Z`), any of `ttft_ms`, `tpot_ms`,
      `e2el_ms` without `tbt_ms`: a request is good when it finished within every threshold
      given; `slo_attainment` is then the share of good requests.

    `request_goodput` is always vLLM's: finished requests per second within the thresholds
    given among ttft_ms, tpot_ms and e2el_ms (tbt_ms is not one of its criteria)."""

    ttft_ms: float | None = None
    tbt_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tbt_ms", "tpot_ms", "e2el_ms"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name}: expected a positive number of milliseconds, got {v!r}")
        if all(getattr(self, n) is None for n in ("ttft_ms", "tbt_ms", "tpot_ms", "e2el_ms")):
            raise ValueError("slo: give at least one of ttft_ms, tpot_ms, e2el_ms (vLLM's "
                             "goodput thresholds) or ttft_ms with tbt_ms (per-token deadlines)")
        if self.tbt_ms is not None and self.ttft_ms is None:
            raise ValueError("tbt_ms: per-token deadlines count from ttft_ms; give ttft_ms too")

    @property
    def per_token(self) -> bool:
        """True for simserve's per-token deadlines (tbt_ms given)."""
        return self.tbt_ms is not None

    def describe(self) -> str:
        """'deadlines: token k by ...; request_goodput: TTFT <= 5000 ms', or vLLM's form."""
        good = [f"{n} <= {v:g} ms" for n, v in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms),
                                                 ("E2E", self.e2el_ms)) if v is not None]
        if not self.per_token:
            return (f"vLLM goodput: {', '.join(good)} (slo_attainment: share of requests "
                    f"within all of them; request_goodput: those per s)")
        return (f"deadlines: token k by arrival + {self.ttft_ms:g} + (k-1)·{self.tbt_ms:g} ms "
                f"(slo_attainment, slo_goodput); request_goodput: {', '.join(good)}")


# --------------------------------------------------------------------------- per request


def _check(rec: RequestRecords) -> None:
    n = len(rec.arrival_s)
    for name in ("prompt_tokens", "output_tokens", "first_token_s", "finish_s", "num_preemptions"):
        if len(getattr(rec, name)) != n:
            raise ValueError(f"RequestRecords.{name}: expected {n} entries, got {len(getattr(rec, name))}")
    off = np.asarray(rec.token_offsets)
    if len(off) != n + 1 or off[0] != 0 or off[-1] != len(rec.token_times_s):
        raise ValueError("RequestRecords.token_offsets: expected n+1 offsets from 0 to len(token_times_s)")
    out = np.asarray(rec.output_tokens)
    if n and out.min() < 1:
        raise ValueError(f"RequestRecords.output_tokens: request {int(np.argmin(out))} has fewer than 1 token")
    if not np.array_equal(np.diff(off), out):
        raise ValueError("RequestRecords.token_offsets: differences must equal output_tokens")


def _derive(rec: RequestRecords) -> dict[str, np.ndarray]:
    """Per-request latencies (s) and the pooled ITL gaps of finished requests."""
    _check(rec)
    a = np.asarray(rec.arrival_s, dtype=np.float64)
    first = np.asarray(rec.first_token_s, dtype=np.float64)
    fin = np.asarray(rec.finish_s, dtype=np.float64)
    n_out = np.asarray(rec.output_tokens, dtype=np.int64)
    off = np.asarray(rec.token_offsets, dtype=np.int64)
    t = np.asarray(rec.token_times_s, dtype=np.float64)
    n = len(a)
    finished = np.isfinite(fin)
    nan = np.full(n, np.nan)

    ttft = first - a  # defined as soon as the first token arrived, even if unfinished
    e2el = np.where(finished, fin - a, np.nan)
    multi = finished & (n_out > 1)
    denom = np.maximum(n_out - 1, 1)
    tpot = np.where(multi, (e2el - ttft) / denom, np.nan)

    mean_itl, max_itl = nan.copy(), nan.copy()
    if n:
        # Mean of the gaps telescopes to (last - first) / (n - 1), read from the token array.
        span = t[off[1:] - 1] - t[off[:-1]]
        mean_itl = np.where(multi, span / denom, np.nan)
    # Gaps inside one request: drop the n-1 gaps that straddle two requests.
    req = np.repeat(np.arange(n), n_out)
    within = req[1:] == req[:-1]
    gaps = np.diff(t)[within]
    gap_req = req[1:][within]
    # reduceat segments must tile the gap array, so reduce every request that has gaps, then mask.
    idx = np.flatnonzero(n_out > 1)
    if idx.size:
        gap_start = np.cumsum(n_out - 1) - (n_out - 1)  # where each request's gaps begin
        max_itl[idx] = np.maximum.reduceat(gaps, gap_start[idx])
        max_itl[~multi] = np.nan
    return {
        "finished": finished,
        "ttft": ttft,
        "e2el": e2el,
        "tpot": tpot,
        "mean_itl": mean_itl,
        "max_itl": max_itl,
        "normalized": e2el / n_out,
        "itl": gaps[finished[gap_req]],
    }


def token_deadlines_s(rec: RequestRecords, slo: SLO) -> np.ndarray:
    """d_{i,k} = a_i + TTFT_SLO + (k-1)·TBT_SLO for every token, aligned with token_times_s."""
    n_out = np.asarray(rec.output_tokens, dtype=np.int64)
    off = np.asarray(rec.token_offsets, dtype=np.int64)
    k0 = np.arange(int(off[-1]) if len(off) else 0) - np.repeat(off[:-1], n_out)  # k - 1
    base = np.asarray(rec.arrival_s, dtype=np.float64) + slo.ttft_ms / 1e3
    # Same order of operations everywhere, so a larger SLO never makes a deadline earlier.
    return np.repeat(base, n_out) + k0 * (slo.tbt_ms / 1e3)


def _slo_met(rec: RequestRecords, slo: SLO, finished: np.ndarray,
             derived: dict | None = None) -> np.ndarray:
    """True where every token k (1-based) arrived by a + TTFT_SLO + (k-1)·TBT_SLO; unfinished
    never. Without tbt_ms (vLLM's form): the requests `_vllm_good` counts."""
    if not slo.per_token:
        return _vllm_good(_derive(rec) if derived is None else derived, slo)
    n = len(rec.arrival_s)
    if n == 0:
        return np.zeros(0, dtype=bool)
    off = np.asarray(rec.token_offsets, dtype=np.int64)
    t = np.asarray(rec.token_times_s, dtype=np.float64)
    on_time = t <= token_deadlines_s(rec, slo)  # NaN (missing) -> False
    return np.logical_and.reduceat(on_time, off[:-1]) & finished


def _vllm_good(d: dict, slo: SLO) -> np.ndarray:
    """vLLM's good requests: finished, TTFT <= ttft_ms, TPOT <= tpot_ms (a one-token request
    has TPOT 0 there), E2E <= e2el_ms; thresholds not given are not checked."""
    good = d["finished"].copy()
    if slo.ttft_ms is not None:
        good &= d["ttft"] * 1e3 <= slo.ttft_ms
    if slo.tpot_ms is not None:
        good &= np.nan_to_num(d["tpot"], nan=0.0) * 1e3 <= slo.tpot_ms
    if slo.e2el_ms is not None:
        good &= d["e2el"] * 1e3 <= slo.e2el_ms
    return good


def request_slo(records: RequestRecords, slo: SLO) -> pd.DataFrame:
    """Per request: `slo_met` (C_i), `num_late_tokens` (missing tokens count as late),
    `first_late_token` (1-based k of the first late token, 0 if none) and `max_lateness_s`
    (max_k t_{i,k} - d_{i,k}: negative = slack left, NaN if a token is missing)."""
    import pandas as pd  # only where a frame is built: summaries need numpy alone
    if not slo.per_token:
        raise ValueError("request_slo: per-token lateness needs an SLO with tbt_ms")
    d = _derive(records)
    n = len(records.arrival_s)
    off = np.asarray(records.token_offsets, dtype=np.int64)
    t = np.asarray(records.token_times_s, dtype=np.float64)
    late_by = t - token_deadlines_s(records, slo)
    late = ~(late_by <= 0)
    frame = pd.DataFrame({"request_id": np.arange(n, dtype=np.int64),
                          "slo_met": _slo_met(records, slo, d["finished"])})
    if n == 0:
        frame["num_late_tokens"] = np.zeros(0, dtype=np.int64)
        frame["first_late_token"] = np.zeros(0, dtype=np.int64)
        frame["max_lateness_s"] = np.zeros(0)
        return frame
    starts = off[:-1]
    frame["num_late_tokens"] = np.add.reduceat(late.astype(np.int64), starts)
    req = np.repeat(np.arange(n), np.diff(off))
    k = np.arange(len(t)) - starts[req] + 1
    first = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(first, req[late], k[late])
    frame["first_late_token"] = np.where(first == np.iinfo(np.int64).max, 0, first)
    frame["max_lateness_s"] = np.maximum.reduceat(late_by, starts)  # NaN propagates
    return frame


def request_frame(records: RequestRecords, slo: SLO | None = None,
                  derived: dict | None = None, met: np.ndarray | None = None) -> pd.DataFrame:
    """One row per request (seconds). scheduled_s is when the workload scheduled it, arrival_s
    when the client sent it (later under max_concurrency; latencies count from it). ttft_s is
    filled once the first token arrived; the other
    latencies are NaN for unfinished requests; slo_met appears only when `slo` is given.
    `derived` (`_derive(records)`) and `met` (`_slo_met`), when the caller has them."""
    import pandas as pd  # only where a frame is built: summaries need numpy alone
    d = _derive(records) if derived is None else derived
    n = len(records.arrival_s)
    frame = pd.DataFrame({
        "request_id": np.arange(n, dtype=np.int64),
        "scheduled_s": np.asarray(records.arrival_s if records.scheduled_s is None
                                  else records.scheduled_s, dtype=np.float64),
        "arrival_s": np.asarray(records.arrival_s, dtype=np.float64),
        "prompt_tokens": np.asarray(records.prompt_tokens, dtype=np.int64),
        "output_tokens": np.asarray(records.output_tokens, dtype=np.int64),
        "first_token_s": np.asarray(records.first_token_s, dtype=np.float64),
        "finish_s": np.asarray(records.finish_s, dtype=np.float64),
        "ttft_s": d["ttft"],
        "e2el_s": d["e2el"],
        "tpot_s": d["tpot"],
        "mean_itl_s": d["mean_itl"],
        "max_itl_s": d["max_itl"],
        "normalized_latency_s": d["normalized"],
        "num_preemptions": np.asarray(records.num_preemptions, dtype=np.int64),
    })
    if slo is not None:
        frame["slo_met"] = _slo_met(records, slo, d["finished"], d) if met is None else met
    return frame


def itl_gaps_s(records: RequestRecords) -> np.ndarray:
    """Every gap between consecutive tokens of every finished request, pooled (seconds)."""
    return _derive(records)["itl"]


# --------------------------------------------------------------------------- summary


def _stats(name: str, seconds: np.ndarray) -> dict[str, float]:
    x = seconds * 1e3
    keys = [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms"] + [
        f"p{p}_{name}_ms" for p in PERCENTILES]
    if x.size == 0:
        return dict.fromkeys(keys, math.nan)
    vals = [np.mean(x), np.median(x), np.std(x), *np.percentile(x, PERCENTILES)]
    return {k: float(v) for k, v in zip(keys, vals)}


def p_word(p: float) -> str:
    """A percentile as vLLM spells it in a key: 99 -> '99', 99.9 -> '99.9'."""
    return str(int(p)) if int(p) == p else str(p)


def more_percentiles(records: RequestRecords, percentiles) -> dict[str, float]:
    """`p{P}_{metric}_ms` of TTFT, TPOT, ITL and E2E latency at further percentiles (vLLM's
    `--metric-percentiles`), over the same finished requests (and ITL gaps) as `summarize`."""
    d = _derive(records)
    out = {}
    for name in LATENCY_METRICS:
        x = d["itl"] if name == "itl" else d[name][np.isfinite(d[name]) & d["finished"]]
        for p in percentiles:
            out[f"p{p_word(p)}_{name}_ms"] = float(np.percentile(x * 1e3, p)) if x.size \
                else math.nan
    return out


def summarize(records: RequestRecords, slo: SLO | None = None) -> dict[str, float]:
    """Run-level metrics named as `vllm bench serve` names them, over finished requests.

    duration runs from the first arrival (of any request) to the last finish; empty sets give
    NaN. With an SLO, slo_attainment is the share of *all* requests that met every per-token
    deadline and slo_goodput those requests per second of duration; request_goodput is vLLM's
    (finished requests per second meeting the TTFT, and where given TPOT and E2E, thresholds).
    """
    d = _derive(records)
    met = _slo_met(records, slo, d["finished"], d) if slo is not None else None
    out = summarize_derived(d, records.prompt_tokens, records.output_tokens, records.finish_s,
                            records.arrival_s, slo, met, _stats("itl", d["itl"]))
    out.update(keep_up(records))  # needs every token time: not in a streamed summary
    return out


def summarize_derived(d: dict, prompt_tokens, output_tokens, finish_s, arrival_s,
                      slo: SLO | None, slo_met, itl_stats: dict) -> dict[str, float]:
    """`summarize` from per-request latencies (`_derive`'s, ITL gaps aside), the SLO verdicts
    and the ITL statistics: a streamed run gathers these chunk by chunk."""
    fin = d["finished"]
    n = len(fin)
    completed = int(fin.sum())
    duration = math.nan
    if completed:
        duration = float(np.max(np.asarray(finish_s)[fin]) - np.min(arrival_s))

    def per_s(x: float) -> float:
        return float(x / duration) if duration > 0 else math.nan

    n_in = int(np.asarray(prompt_tokens, dtype=np.int64)[fin].sum())
    n_out = int(np.asarray(output_tokens, dtype=np.int64)[fin].sum())
    out: dict[str, float] = {
        "completed": completed,
        "duration": duration,
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": per_s(completed),
        "output_throughput": per_s(n_out),
        "total_token_throughput": per_s(n_in + n_out),
    }
    for name in LATENCY_METRICS:
        if name == "itl":
            out.update(itl_stats)
        else:
            out.update(_stats(name, d[name][np.isfinite(d[name]) & fin]))
    norm = d["normalized"][fin]
    out["mean_normalized_latency_s"] = float(np.mean(norm)) if norm.size else math.nan
    out["num_unfinished"] = n - completed
    if slo is not None:
        met = int(np.asarray(slo_met).sum())
        out["slo_attainment"] = met / n if n else math.nan
        out["slo_goodput"] = per_s(met)
        out["request_goodput"] = per_s(int(_vllm_good(d, slo).sum()))
    return out


# A run keeps up when it delivers at least this share of the work offered late in the arrival
# window (docs/metrics.md, "Sustained goodput"). 0.95 mirrors the 95 % attainment threshold; it is our choice, not a
# paper's: neither paper defines a keep-up test.
KEEP_UP_THRESHOLD = 0.95
KEEP_UP_KEYS = ("keep_up_ratio", "backlog_requests_at_last_arrival",
                "backlog_tokens_at_last_arrival")


def keep_up(records: RequestRecords) -> dict[str, float]:
    """Did the system keep up with the offered load, or drain a backlog after the arrivals?

    Work is counted in tokens. Over the second half of the arrival window [t_mid, t_last]
    (first to last arrival; the first half lets the system fill to steady state):
    `keep_up_ratio` = work delivered / work offered, where a request's prompt counts as
    delivered when its first token appears (prefill progress is not recorded) and each output
    token when it is emitted, and a request's prompt plus outputs count as offered at its
    arrival. In steady state the two rates match whatever the latency; a system that falls
    behind, or that starves some requests (SRPT past saturation leaves long prompts waiting
    while attainment stays above 95 %), delivers less than it is offered.

    Also the backlog at the last arrival: requests arrived and unfinished, and their
    undelivered tokens (a prompt not yet prefilled counts whole). A stable system's backlog is
    what Little's law says (rate × latency); an overloaded one's grows with the window.
    """
    a = np.asarray(records.arrival_s, dtype=np.float64)
    nan = dict(keep_up_ratio=math.nan, backlog_requests_at_last_arrival=math.nan,
               backlog_tokens_at_last_arrival=math.nan)
    if len(a) < 2 or not a.max() > a.min():
        return nan
    prompt = np.asarray(records.prompt_tokens, dtype=np.int64)
    n_out = np.asarray(records.output_tokens, dtype=np.int64)
    first = np.asarray(records.first_token_s, dtype=np.float64)
    fin = np.asarray(records.finish_s, dtype=np.float64)
    tok = np.asarray(records.token_times_s, dtype=np.float64)
    t_last = float(a.max())
    t_mid = 0.5 * (float(a.min()) + t_last)
    late = (a > t_mid) & (a <= t_last)
    offered = int((prompt[late] + n_out[late]).sum())
    in_win = (first > t_mid) & (first <= t_last)          # NaN compares False: never prefilled
    delivered = int(prompt[in_win].sum()) + int(((tok > t_mid) & (tok <= t_last)).sum())
    # backlog at t_last: every request has arrived; those unfinished hold undelivered work
    open_ = ~(fin <= t_last)
    emitted = np.add.reduceat((tok <= t_last).astype(np.int64),
                              np.asarray(records.token_offsets, dtype=np.int64)[:-1])
    not_pre = ~(first <= t_last)
    backlog = int((n_out[open_] - emitted[open_]).sum()) + int(prompt[open_ & not_pre].sum())
    return dict(keep_up_ratio=delivered / offered if offered else math.nan,
                backlog_requests_at_last_arrival=int(open_.sum()),
                backlog_tokens_at_last_arrival=backlog)


def weighted_stats(name: str, values_s: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    """`_stats` of the multiset where values_s[j] (sorted, distinct) occurs counts[j] times;
    percentiles as numpy's linear method computes them on the expanded array."""
    keys = [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms"] + [
        f"p{p}_{name}_ms" for p in PERCENTILES]
    N = int(counts.sum())
    if N == 0:
        return dict.fromkeys(keys, math.nan)
    x = values_s * 1e3
    c = counts.astype(np.float64)
    mean = float((x * c).sum() / N)
    std = float(np.sqrt((c * (x - mean) ** 2).sum() / N))
    ends = np.cumsum(counts)  # x[j] covers sorted positions [ends[j-1], ends[j])

    def at(k: int) -> float:
        return float(x[np.searchsorted(ends, k, side="right")])

    def pct(q: float) -> float:
        h = (N - 1) * q / 100
        lo = math.floor(h)
        a, b, t = at(lo), at(min(lo + 1, N - 1)), h - lo
        return float(a + (b - a) * t if t < 0.5 else b - (b - a) * (1 - t))
    mid = (N - 1) / 2
    median = at(int(mid)) if N % 2 else (at(N // 2 - 1) + at(N // 2)) / 2
    return dict(zip(keys, [mean, float(median), std, *(pct(p) for p in PERCENTILES)]))


# --------------------------------------------------------------------------- rate curves


def _curve(rates, values) -> tuple[np.ndarray, np.ndarray]:
    r = np.asarray(rates, dtype=np.float64).ravel()
    v = np.asarray(values, dtype=np.float64).ravel()
    if r.size == 0 or r.size != v.size:
        raise ValueError(f"rates and values: expected equal, non-zero lengths, got {r.size} and {v.size}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rates: expected finite numbers")
    order = np.argsort(r, kind="stable")
    r, v = r[order], v[order]
    if np.any(np.diff(r) == 0):
        raise ValueError(f"rates: duplicate rate {float(r[np.flatnonzero(np.diff(r) == 0)[0]])}")
    return r, v


def _between(r: np.ndarray, v: np.ndarray, j: int, target: float) -> tuple[float, bool]:
    """Crossing of `target` between point j (passing) and j+1 (failing); a NaN neighbour cannot
    be interpolated, so the passing rate is returned as a censored lower bound."""
    if not math.isfinite(v[j + 1]):
        return float(r[j]), True
    return float(r[j] + (target - v[j]) * (r[j + 1] - r[j]) / (v[j + 1] - v[j])), False


def sustainable_rate(rates, values, target: float) -> tuple[float, bool]:
    """First rate where a rising curve (latency vs rate) crosses `target` (DualPace §6.1).

    Points are sorted by rate; a value <= target passes, NaN fails. Linear interpolation between
    the last passing point before the first failure and that failure; never extrapolates:
    - the lowest rate already fails -> (nan, True), censored low;
    - no point fails -> (highest rate, True), censored high (a lower bound).
    """
    r, v = _curve(rates, values)
    fail = ~(v <= target)
    if not fail.any():
        return float(r[-1]), True
    j = int(np.argmax(fail))
    if j == 0:
        return math.nan, True
    return _between(r, v, j - 1, target)


def max_rate_meeting(rates, attainment, threshold: float = 0.95) -> tuple[float, bool]:
    """Goodput: the highest rate a system *sustains* with attainment >= threshold
    (ConfluxServe §8.1: "the maximum sustainable request rate at which at least 95 % of
    requests are SLO-compliant"; Fig. 12: "the maximum arrival rate a system sustains").

    The first crossing, as `sustainable_rate`: the rates are walked upward and the curve is cut
    at the first point below the threshold (NaN fails), interpolating between it and the last
    passing point before it. A later recovery does not count: past saturation a finite run can
    pass again spuriously (SRPT serves the short requests and starves a tail smaller than
    1 − threshold), but no rate above a failing one is sustained. (At main 8821cc1 the last
    passing point won, which reported MuxWise++ on QwenA as "≥ 20" across a failure at 16.)
    Censoring: the lowest rate fails -> (nan, True); no rate fails -> (highest rate, True).
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold: expected a fraction in (0, 1], got {threshold!r}")
    r, v = _curve(rates, attainment)
    fail = ~(v >= threshold)
    if not fail.any():
        return float(r[-1]), True
    j = int(np.argmax(fail))
    if j == 0:
        return math.nan, True
    return _between(r, -v, j - 1, -threshold)  # attainment falls with rate: mirror it


def first_failure(results: list[tuple[float, bool]]) -> tuple[float, bool]:
    """Capacity under several targets at once: the lowest of their first crossings.

    Each entry is (rate, censored) as `sustainable_rate` / `max_rate_meeting` return it. Any
    (nan, True) (the lowest rate already fails) wins; else the smallest rate, censored only if
    every target at that rate is censored (no target crossed below the highest rate)."""
    if not results:
        raise ValueError("results: expected at least one (rate, censored) pair")
    if any(math.isnan(r) for r, _ in results):
        return math.nan, True
    lo = min(r for r, _ in results)
    return lo, all(c for r, c in results if r == lo)


def sustained_goodput(rates, attainment, keep_up_ratio, threshold: float = 0.95,
                      keep_up_min: float = KEEP_UP_THRESHOLD) -> tuple[float, bool]:
    """Goodput that also keeps up: the highest rate below which attainment >= threshold AND
    keep_up_ratio >= keep_up_min. 95 % attainment alone lets a design starve
    < 5 % of the requests (the long prompts) without end; the keep-up test catches that."""
    return first_failure([max_rate_meeting(rates, attainment, threshold),
                          max_rate_meeting(rates, keep_up_ratio, keep_up_min)])
