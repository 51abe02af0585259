"""Waterfill prefill dispatch (policies.md §7.3; paper Alg. 2, App. E).

The shared linear region waits for the rank with the most tokens (prefill + decode), so the
TBT-safe prefill budget is largest when every rank is filled to a common water level. A binary
search over levels that are multiples of the quantum q finds the highest level n_tgt at which
the estimator keeps the iteration within τ; a candidate's chunk is then poured onto the
least-loaded ranks first, never above n_tgt. Each call is O(N log B) estimator work.
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import add
from typing import Sequence

from simserve.errors import ConfigError
from simserve.policies.conflux.estimator import ConfluxEstimator, prefill_work

# Alignment quantum (tokens per rank) of the water level. The paper determines it empirically
# per device and does not give it; 16 is the row granularity of bf16 tensor-core tiles, small
# enough that rounding the level down wastes at most 16 tokens per rank.
DEFAULT_QUANTUM = 16
# Highest water level ever tried (tokens per rank): a guard for estimators whose time barely
# grows with tokens (e.g. all slopes fitted to 0), not a limit anyone should hit in practice.
DEFAULT_MAX_LEVEL = 1 << 20


@dataclass(frozen=True, slots=True)
class RankState:
    """What the scheduler knows about one logical rank at the start of an iteration."""

    num_decodes: int = 0          # resident decodes (one token each this iteration)
    decode_ctx_tokens: int = 0    # Σ context of those decodes
    kv_used_blocks: int = 0       # KV blocks in use (placement only)
    kv_total_blocks: int = 0      # KV pool size (placement only)
    decode_max_ctx: int = 0       # longest resident decode context (a profiled f_D prices it)

    @property
    def kv_util(self) -> float:
        return self.kv_used_blocks / self.kv_total_blocks if self.kv_total_blocks > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Candidate:
    """A prefill asking for a chunk: m_i tokens still to prefill after c_i already in KV."""

    remaining_tokens: int
    context_tokens: int = 0


def waterfill(tokens: int, loads: Sequence[int], level: int) -> tuple[int, ...]:
    """Spread `tokens` over ranks, raising the least-loaded first, no rank above `level`.

    Ties (and the remainder of an integer level) go to the lower load, then the lower index.
    """
    n = len(loads)
    out = [0] * n
    if tokens <= 0:
        return tuple(out)
    order = sorted(range(n), key=loads.__getitem__)  # stable: ties keep the lower index
    cap = 0
    for x in loads:
        if level > x:
            cap += level - x
    if tokens > cap:
        raise ValueError(f"waterfill: {tokens} tokens do not fit below level {level} (room {cap})")
    # find the water level w: raise the k lowest ranks together until the tokens run out
    left, k, w = tokens, 0, loads[order[0]]
    while left > 0:
        while k < n and loads[order[k]] <= w:
            k += 1
        nxt = min(loads[order[k]] if k < n else level, level)
        step = (nxt - w) * k
        if step >= left:
            w += left // k
            left -= (left // k) * k
            break
        w, left = nxt, left - step
    for r in order[:k]:
        out[r] = max(0, w - loads[r])
    for r in order[:k]:  # remainder: one more token to the lowest-loaded of the raised ranks
        if left == 0:
            break
        if loads[r] + out[r] < level:
            out[r] += 1
            left -= 1
    return tuple(out)


class _Search:
    """The per-call state of one dispatch: everything that does not depend on the level.
    `nd`, `t_d`: the ranks' decodes and T_D (`decode_state`); `work`: Σ prefill work of the
    chunks already placed this iteration."""

    __slots__ = ("tau", "est", "cand", "m", "ap", "nd", "loads", "max_load", "work", "t_d",
                 "_times", "_past", "_R", "_sum_loads", "_min_nd", "_ctx", "_last")

    def __init__(self, tau: float, est: ConfluxEstimator, nd: list[int], t_d: float | None,
                 ap: list[int], work: float, cand: Candidate | None):
        self.tau, self.est, self.cand = tau, est, cand
        self.m = None if cand is None else cand.remaining_tokens
        self.ap, self.nd, self.work, self.t_d = ap, nd, work, t_d
        self.loads = loads = list(map(add, ap, nd))
        self.max_load = max(loads)
        self._R, self._sum_loads, self._min_nd = len(ap), sum(loads), min(nd)
        self._ctx = None if cand is None else cand.context_tokens
        self._last = None   # (top, q, last_multiple)
        self._times: dict[int, float] = {}
        # (time, extra per rank) of every level whose room exceeds the candidate's tokens:
        # waterfill(m, loads, level) is the same there (the level only caps the pouring, and
        # m fits below any such level; tests/test_conflux_speed.py), so one evaluation serves
        # them all
        self._past: tuple[float, tuple[int, ...]] | None = None

    def last_multiple(self, top: int, q: int) -> int:
        """P: the first of 1, 2, 4, … (top where the doubling reaches it) whose level has room
        for the candidate's m_i tokens, past which its chunk and so the time stop growing; top
        without a candidate. room() being nondecreasing, P is the first power of two at or
        above the fewest multiples of q with room for m_i, capped at top."""
        if self.m is None:
            return top
        c = self._last
        if c is not None and c[0] == top and c[1] == q:
            return c[2]
        k = -(-self.least_level(self.m) // q)
        P = min(top, 1 << max(k - 1, 0).bit_length())
        self._last = (top, q, P)
        return P

    def any_token(self, top: int, q: int) -> bool:
        """Whether the search's level has room for a token: the level is the highest safe
        multiple up to P (`last_multiple`), and room() is 0 up to the lowest load, so it has
        room iff the first multiple above the lowest load is at most P and safe (the time
        being nondecreasing in the level)."""
        k = min(self.loads) // q + 1
        return k <= self.last_multiple(top, q) and self.ok(k * q)

    def least_level(self, tokens: int) -> int:
        """The lowest level with room() >= tokens: with the k lowest loads raised to a level
        between the k-th and the next load, room is k·level − (their sum)."""
        if tokens <= 0:
            return 0
        xs = sorted(self.loads)
        s, n = 0, len(xs)
        for k in range(1, n + 1):
            s += xs[k - 1]
            level = -(-(tokens + s) // k)
            if k == n or level <= xs[k]:
                return level
        raise AssertionError("unreachable")

    def room(self, level: int) -> int:
        """B(level): tokens that fit below `level` on top of the current loads."""
        r = 0
        for x in self.loads:
            if level > x:
                r += level - x
        return r

    def fill(self, tokens: int, level: int) -> tuple[int, ...]:
        """Extra prefill tokens per rank for `tokens` (at most room(level)) below `level`:
        waterfill's split. All of the room is every rank filled to `level`; the candidate's
        m_i below a level with more room is the split `past` already made."""
        if tokens == self.m and self._past is not None:
            return self._past[1]
        if tokens == self.room(level):
            return tuple(level - x if level > x else 0 for x in self.loads)
        return waterfill(tokens, self.loads, level)

    def past(self, level: int) -> tuple[float, tuple[int, ...]]:
        """(time, extra) at a level whose room exceeds the candidate's m_i tokens."""
        if self._past is None:
            extra = waterfill(self.m, self.loads, level)
            n_p = [a + e for a, e in zip(self.ap, extra)]
            max_tokens, max_p = max(p + d for p, d in zip(n_p, self.nd)), max(n_p)
            work = self.work
            if self.m > 0:
                work += prefill_work(self.m, self.cand.context_tokens)
            self._past = (self.est.combine(max_tokens, max_p, work, len(self.ap), self.t_d),
                          extra)
        return self._past

    def time(self, level: int) -> float:
        t = self._times.get(level)
        if t is not None:
            return t
        m = self.m
        if level >= self.max_load:
            # every rank at or below the level: the loop below's integers in closed form,
            # chunk R·level − Σ loads and max_r a_r + (level − load_r) = level − min_r n_d^r
            chunk = self._R * level - self._sum_loads
            max_p = level - self._min_nd
        else:
            chunk, max_p = 0, None
            for a, x in zip(self.ap, self.loads):
                e = level - x if level > x else 0
                chunk += e
                if max_p is None or a + e > max_p:
                    max_p = a + e
        if m is not None and m < chunk:   # chunk is room(level) here
            t = self._times[level] = self.past(level)[0]
            return t
        # every rank filled up to `level`: its tokens are max(load, level), the largest
        # of them max(max load, level)
        max_tokens = level if level > self.max_load else self.max_load
        work = self.work
        # without a candidate the extra tokens carry no attention work (paper App. E: the
        # reference budget omits the candidate-specific prefill workload)
        if m is not None and chunk > 0:
            work += chunk * (self._ctx + (chunk + 1) / 2.0)   # prefill_work(chunk, c_i)
        t = self._times[level] = self.est.combine(max_tokens, max_p, work, self._R, self.t_d)
        return t

    def ok(self, level: int) -> bool:
        t = self._times.get(level)
        return (self.time(level) if t is None else t) <= self.tau

    def saturated(self, level: int) -> bool:
        """Past this level the candidate's chunk no longer grows, so neither does the time."""
        return self.m is not None and self.room(level) >= self.m


def decode_state(est: ConfluxEstimator, ranks: Sequence[RankState]
                 ) -> tuple[list[int], float | None]:
    """The ranks' decodes and T_D: what every dispatch of one iteration shares."""
    if len(ranks) == 0:
        raise ConfigError("dispatch: ranks_state: expected at least one rank")
    nd = [r.num_decodes for r in ranks]
    return nd, est.decode_path(nd, [r.decode_ctx_tokens for r in ranks],
                               [r.decode_max_ctx for r in ranks])


def _prepare(tau: float, est: ConfluxEstimator, nd: list[int], t_d: float | None,
             ap: list[int] | None, work: float, cand: Candidate | None,
             quantum: int) -> _Search:
    """A search's state, its inputs checked."""
    if quantum < 1:
        raise ConfigError(f"dispatch: quantum: expected a positive integer, got {quantum!r}")
    if tau <= 0:
        raise ConfigError(f"dispatch: tau: expected a positive TBT SLO, got {tau!r}")
    if ap is None:
        ap = [0] * len(nd)
    elif len(ap) != len(nd):
        raise ConfigError(f"dispatch: Ap: expected {len(nd)} per-rank counts, got {len(ap)}")
    if cand is not None and (cand.remaining_tokens < 0 or cand.context_tokens < 0):
        raise ConfigError(f"dispatch: candidate: token counts must be >= 0, got {cand}")
    return _Search(tau, est, nd, t_d, ap, work, cand)


def _search(tau: float, est: ConfluxEstimator, nd: list[int], t_d: float | None,
            ap: list[int] | None, work: float, cand: Candidate | None, quantum: int,
            max_level: int, hint: int | None) -> tuple[int, _Search]:
    """(n_tgt, the search's state): `find_level` on a prepared decode state."""
    s = _prepare(tau, est, nd, t_d, ap, work, cand, quantum)
    return _level(s, max_level // quantum, quantum, hint), s


def _level(s: _Search, top: int, quantum: int, hint: int | None) -> int:
    if top < 1:
        return 0
    if hint is not None:
        return _from_hint(s, top, quantum, hint)
    if not s.ok(quantum):
        return 0
    lo, hi = 1, None               # lo: known safe multiple; hi: known unsafe multiple
    while hi is None:
        if s.saturated(lo * quantum) or lo >= top:
            return min(lo, top) * quantum
        nxt = min(2 * lo, top)
        if s.ok(nxt * quantum):
            lo = nxt
        else:
            hi = nxt
    return _bisect(s, lo, hi, quantum)


def _ints(ap: Sequence[int] | None) -> list[int] | None:
    """Ap as a list of Python ints (what `dispatch_on` takes; numpy integers would do the same
    arithmetic slower)."""
    return None if ap is None else [int(x) for x in ap]


def _work(prefills: Sequence[tuple[int, int]]) -> float:
    return sum(prefill_work(ell, c) for ell, c in prefills if ell > 0)


def find_level(tau: float, est: ConfluxEstimator, ranks_state: Sequence[RankState],
               Ap: Sequence[int] | None = None, prefills: Sequence[tuple[int, int]] = (),
               candidate: Candidate | None = None, quantum: int = DEFAULT_QUANTUM,
               max_level: int = DEFAULT_MAX_LEVEL, hint: int | None = None) -> int:
    """n_tgt: the highest multiple of `quantum` (≤ max_level) whose filled state stays within τ.

    Returns 0 when no level is safe (then nothing is dispatched). Time is nondecreasing in the
    level, so doubling then bisecting over quantum multiples finds it in O(log B) estimates.
    With a `hint` (a level near the answer, e.g. the last one) the same answer is found by
    galloping from it (`_from_hint`), in O(log |answer − hint|) estimates.
    """
    nd, t_d = decode_state(est, ranks_state)
    return _search(tau, est, nd, t_d, _ints(Ap), _work(prefills), candidate, quantum,
                   max_level, hint)[0]


def _from_hint(s: _Search, top: int, q: int, hint: int) -> int:
    """`find_level`'s answer searched from `hint` (multiples of q): the highest safe multiple
    up to P (`_Search.last_multiple`), 0 if even 1 is unsafe. The time being nondecreasing in
    the level, any bracketing of where it crosses τ finds it; the probes here follow the
    times: the hint, its neighbour, then where the line through the last two times crosses τ
    (steps at least doubling on the way out), then `_narrow`. An exact hint costs two
    estimates."""
    P = s.last_multiple(top, q)
    tau, time = s.tau, s.time
    h = min(max(hint // q, 1), P)
    th = time(h * q)
    if th <= tau:                  # safe at h: find an unsafe multiple above it
        if h == P:
            return P * q
        lo, tlo, x, step = h, th, h + 1, 1
        tx = time(x * q)
        while tx <= tau:
            if x == P:
                return P * q
            # the first multiple past the line's crossing of τ
            nxt = x + 1 + int((tau - tx) * (x - lo) / (tx - tlo)) if tx > tlo else P
            step *= 2
            lo, tlo = x, tx
            x = min(P, max(nxt, x + step))
            tx = time(x * q)
        hi, thi = x, tx
    else:                          # unsafe at h: find a safe multiple below it
        if h == 1:
            return 0
        hi, thi, x, step = h, th, h - 1, 1
        tx = time(x * q)
        while tx > tau:
            if x == 1:
                return 0
            # the last multiple before the line's crossing of τ
            nxt = x - 1 - int((tx - tau) * (hi - x) / (thi - tx)) if thi > tx else 1
            step *= 2
            hi, thi = x, tx
            x = max(1, min(nxt, x - step))
            tx = time(x * q)
        lo, tlo = x, tx
    return _narrow(s, lo, tlo, hi, thi, q)


def _narrow(s: _Search, lo: int, tlo: float, hi: int, thi: float, q: int) -> int:
    """The highest safe multiple of q between a safe `lo` and an unsafe `hi` (multiples, with
    their times): probe where the chord crosses τ, or the middle when the last probe left
    more than half of the bracket."""
    tau, time = s.tau, s.time
    halve = False
    while hi - lo > 1:
        if halve:
            x = (lo + hi) // 2
        else:
            x = lo + int((tau - tlo) * (hi - lo) / (thi - tlo))
            x = lo + 1 if x <= lo else hi - 1 if x >= hi else x
        width = hi - lo
        tx = time(x * q)
        if tx <= tau:
            lo, tlo = x, tx
        else:
            hi, thi = x, tx
        halve = 2 * (hi - lo) > width
    return lo * q


def _bisect(s: _Search, lo: int, hi: int, q: int) -> int:
    """The highest safe multiple of q between a safe `lo` and an unsafe `hi` (multiples)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if s.ok(mid * q):
            lo = mid
        else:
            hi = mid
    return lo * q


def dispatch(tau: float, est: ConfluxEstimator, ranks_state: Sequence[RankState],
             Ap: Sequence[int] | None = None, candidate: Candidate | None = None,
             quantum: int = DEFAULT_QUANTUM, prefills: Sequence[tuple[int, int]] = (),
             max_level: int = DEFAULT_MAX_LEVEL, hints: dict | None = None):
    """Alg. 2. Ap: prefill tokens already assigned per rank this iteration; prefills: their
    (ℓ, c) chunks. Without a candidate, returns the reference budget B (int); with one,
    (ℓ_i, A_i): its chunk length min(m_i, B) and the per-rank split of that chunk.
    `hints` (a dict the caller keeps): the last levels found, to search from (same answers)."""
    nd, t_d = decode_state(est, ranks_state)
    return dispatch_on(tau, est, nd, t_d, _ints(Ap), candidate, quantum, _work(prefills),
                       max_level, hints)


def dispatch_on(tau: float, est: ConfluxEstimator, nd: list[int], t_d: float | None,
                Ap: list[int] | None, candidate: Candidate | None, quantum: int,
                work: float, max_level: int, hints: dict | None, only_if_room: bool = False,
                report: dict | None = None):
    """`dispatch` on a prepared decode state (`decode_state`) and Σ prefill work of the
    chunks already placed: what Alg. 1 calls once per candidate of an iteration (`Ap` a list
    of Python ints, read, not copied). The
    candidate may be anything with a Candidate's `remaining_tokens` and `context_tokens`
    (the plan hands its PendingPrefill). `only_if_room`: first ask whether the candidate gets
    any token (`_Search.any_token`, one estimate) and return (0, no split) without searching
    or touching `hints` when it does not. `report`: receives under "estimate" the estimated
    time with the candidate's chunk placed (the search's memo at its level: the split is
    every rank filled to it, or m_i's, which `past` priced)."""
    key = candidate is not None
    s = _prepare(tau, est, nd, t_d, Ap, work, candidate, quantum)
    top = max_level // quantum
    if only_if_room and key and not s.any_token(top, quantum):
        return 0, (0,) * len(nd)
    level = _level(s, top, quantum, None if hints is None else hints.get(key, 0))
    if hints is not None:
        hints[key] = level
    budget = s.room(level)
    if candidate is None:
        return budget
    ell = min(candidate.remaining_tokens, budget)
    if report is not None and ell:
        report["estimate"] = s.time(level)
    return ell, s.fill(ell, level)


def even_split(tokens: int, num_ranks: int) -> tuple[int, ...]:
    """`tokens` spread evenly over the ranks, the remainder one each to the lowest indices."""
    q, r = divmod(tokens, num_ranks)
    return tuple(q + 1 if i < r else q for i in range(num_ranks))


def even_dispatch_on(tau: float, est: ConfluxEstimator, nd: list[int], t_d: float | None,
                     Ap: list[int], candidate, quantum: int, work: float, max_level: int,
                     report: dict | None = None) -> tuple[int, tuple[int, ...]]:
    """Even dispatch (`waterfill: false`, Fig. 15a's comparison): the candidate's chunk is split
    evenly over the ranks whatever their decode load; its length is the largest multiple of
    R·quantum (or all of m_i) whose estimate stays within τ with no rank's tokens above
    `max_level`. (ℓ_i, A_i) as `dispatch_on` returns them."""
    R = len(nd)
    m, c = candidate.remaining_tokens, candidate.context_tokens
    top = max(a + d for a, d in zip(Ap, nd))
    cap = min(m, R * max(0, max_level - top))

    def time(ell: int) -> float:
        n_p = [a + e for a, e in zip(Ap, even_split(ell, R))]
        return est.combine(max(p + d for p, d in zip(n_p, nd)), max(n_p),
                           work + prefill_work(ell, c), R, t_d)

    step = R * quantum
    if cap > 0 and time(cap) <= tau:
        ell = cap
    else:
        lo, hi = 0, -(-cap // step)        # multiples k·step, k < hi (hi·step ≥ cap fails)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if time(mid * step) <= tau:
                lo = mid
            else:
                hi = mid
        ell = lo * step
    if ell == 0:
        return 0, (0,) * R
    if report is not None:
        report["estimate"] = time(ell)
    return ell, even_split(ell, R)
