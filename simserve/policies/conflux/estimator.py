"""Latency estimator of a Conflux Parallelism iteration (policies.md §7.2; paper Eq. 2–6, App. D).

    T_iter = L · (T_GEMM + max(β·T_P, α·T_D))
    T_GEMM = γ · max_r (n_p^r + n_d^r) + γ0
    T_D    = max_r (a_D · Σ_{i on r} c_i + a_D0)
    T_P    = (a_comm · max_r n_p^r + a_comm0) + (a_P · (1/N) Σ_i ℓ_i (c_i + (ℓ_i+1)/2) + a_P0)

Assumption (not in the paper): a path with no work contributes nothing, so an empty prefill
path drops T_P, a rank without decodes does not enter T_D, and an empty iteration costs 0.

`decode_fn` (optional): f_D evaluated from the decode-attention profile of each rank's actual
decode set (decodes, Σ context, longest context) instead of the affine fit in Σ context. The
decode set is fixed while a dispatch searches its water level, so T_D needs no closed form; the
profile's split-K decode kernel has a straggler tail set by the longest context, which an affine
f_D(Σ c) cannot express (see `fit.fit_from_cost`).
Times are in whatever unit the coefficients were fitted in (seconds when fitted from simserve's
cost model); compare them with τ in the same unit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

from simserve.errors import ConfigError

# the four base functions and the sample key each is fitted from (App. D, Eq. 7–11)
TERMS = {"gemm": ("gamma", "gamma0"), "decode_attn": ("a_d", "a_d0"),
         "prefill_attn": ("a_p", "a_p0"), "comm": ("a_comm", "a_comm0")}


def prefill_work(chunk_tokens: int, context_tokens: int) -> float:
    """Causal attention work of a chunk of ℓ new tokens after c cached ones: ℓ(c + (ℓ+1)/2)."""
    return chunk_tokens * (context_tokens + (chunk_tokens + 1) / 2.0)


@dataclass(frozen=True, slots=True)
class ConfluxEstimator:
    """Affine per-layer coefficients of Eq. 7–11, contention factors α, β and the layer count L."""

    gamma: float
    gamma0: float
    a_d: float
    a_d0: float
    a_comm: float
    a_comm0: float
    a_p: float
    a_p0: float
    alpha: float = 1.0
    beta: float = 1.0
    num_layers: int = 1
    overlap: bool = True  # False: T_P + T_D instead of max(β·T_P, α·T_D) (Fig. 13 ablation)
    # True: Eq. 2 to the letter, max(β·T_P, α·T_D) even when one path is empty (a lone
    # prefill costs β·T_P). False (default): the factors price contention between the two
    # paths only — a lone path costs its own time, and overlap is never slower than running the
    # paths back to back — the same form as simserve's SP cost model (simserve/cost/sp.py), so the
    # cost model's α, β carry over to the estimator exactly
    literal: bool = False
    # f_D from the profile: (decodes, Σ context, longest context) -> seconds per layer; None:
    # the affine a_D·Σc + a_D0 of Eq. 8
    decode_fn: Callable[[int, int, int | None], float] | None = field(default=None, compare=False,
                                                                        repr=False)
    # the last (decode state, T_D) of `decode_path` with `decode_fn`: one iteration's dispatch
    # asks for the same decode state several times (one search per candidate)
    _last_td: list = field(default_factory=lambda: [None, None], init=False, compare=False,
                           repr=False)

    _NUMERIC = ("gamma", "gamma0", "a_d", "a_d0", "a_comm", "a_comm0", "a_p", "a_p0", "alpha",
                "beta", "num_layers")

    def __post_init__(self) -> None:
        for name in self._NUMERIC:
            v = getattr(self, name)
            if not np.isfinite(v) or v < 0:
                raise ConfigError(f"ConfluxEstimator.{name}: expected a finite value >= 0, got {v!r}")
        if self.decode_fn is not None and not callable(self.decode_fn):
            raise ConfigError(f"ConfluxEstimator.decode_fn: expected a callable or None, got "
                              f"{self.decode_fn!r}")
        if self.alpha <= 0 or self.beta <= 0:
            raise ConfigError(f"ConfluxEstimator.alpha/beta: expected > 0, got {self.alpha}, {self.beta}")
        if int(self.num_layers) != self.num_layers or self.num_layers < 1:
            raise ConfigError(f"ConfluxEstimator.num_layers: expected a positive integer, "
                              f"got {self.num_layers!r}")

    # -- the pieces, so that dispatch can precompute what does not change during its search --
    def decode_path(self, n_d: Sequence[int], decode_ctx: Sequence[int],
                    decode_max: Sequence[int] | None = None) -> float | None:
        """T_D, or None when no rank holds a decode. `decode_max`: each rank's longest decode
        context (used by `decode_fn` only; None: contexts taken as equal)."""
        if self.decode_fn is not None:
            dm = [None] * len(n_d) if decode_max is None else decode_max
            key = (tuple(n_d), tuple(decode_ctx), tuple(dm))
            if self._last_td[0] == key:
                return self._last_td[1]
            t = [self.decode_fn(int(n), int(c), None if m is None or m <= 0 else int(m))
                 for n, c, m in zip(n_d, decode_ctx, dm) if n > 0]
            self._last_td[:] = [key, max(t) if t else None]
            return self._last_td[1]
        else:
            t = [self.a_d * c + self.a_d0 for n, c in zip(n_d, decode_ctx) if n > 0]
        return max(t) if t else None

    def combine(self, max_tokens: int, max_prefill_tokens: int, prefill_work_sum: float,
                num_ranks: int, t_d: float | None) -> float:
        """T_iter from the per-rank maxima, Σ prefill work and T_D (None: no decode path)."""
        if max_tokens <= 0:
            return 0.0
        t_gemm = self.gamma * max_tokens + self.gamma0
        if max_prefill_tokens <= 0 or t_d is None or not self.overlap:
            t_p = self.prefill_path(max_prefill_tokens, prefill_work_sum, num_ranks)
            return self.num_layers * (t_gemm + self.split(t_p, t_d))
        # both paths run, overlapped (dispatch's common case, called ~10 times an iteration):
        # `prefill_path` and `split` inlined, the same expressions (`t or 0.0` is t for a
        # float); max / min spelled out as the builtins pick (the first of equals)
        t_p = (self.a_comm * max_prefill_tokens + self.a_comm0
               + self.a_p * prefill_work_sum / num_ranks + self.a_p0)
        a, b = self.beta * t_p, self.alpha * t_d
        hi = b if b > a else a
        if self.literal:
            return self.num_layers * (t_gemm + hi)
        both = t_p + t_d
        return self.num_layers * (t_gemm + (both if both < hi else hi))

    def prefill_path(self, max_prefill_tokens: int, prefill_work_sum: float,
                     num_ranks: int) -> float | None:
        """T_P: both all-to-alls sized by the largest shard, and the head-sharded attention
        over every chunk's work (None: no prefill this iteration)."""
        if max_prefill_tokens <= 0:
            return None
        return (self.a_comm * max_prefill_tokens + self.a_comm0
                + self.a_p * prefill_work_sum / num_ranks + self.a_p0)

    def split(self, t_p: float | None, t_d: float | None) -> float:
        """The split attention region from its two paths (None: empty)."""
        if t_p is None and t_d is None:
            return 0.0
        if not self.overlap:
            return (t_p or 0.0) + (t_d or 0.0)
        if self.literal:
            return max(self.beta * (t_p or 0.0), self.alpha * (t_d or 0.0))
        if t_p is None or t_d is None:
            return t_p if t_d is None else t_d
        return min(max(self.beta * t_p, self.alpha * t_d), t_p + t_d)

    def paths(self, n_p: Sequence[int], n_d: Sequence[int], decode_ctx: Sequence[int],
              prefills: Sequence[tuple[int, int]],
              decode_max: Sequence[int] | None = None) -> tuple[float, float, float]:
        """Per layer: T_GEMM, T_P and T_D before the contention factors (NaN for an empty
        path), so that α and β can be varied over many batches at once (`estimate_many`)."""
        t_gemm = self.gamma * max(p + d for p, d in zip(n_p, n_d)) + self.gamma0
        work = sum(prefill_work(ell, c) for ell, c in prefills if ell > 0)
        t_p = self.prefill_path(max(n_p), work, len(n_d))
        t_d = self.decode_path(n_d, decode_ctx, decode_max)
        return t_gemm, np.nan if t_p is None else t_p, np.nan if t_d is None else t_d

    def iteration_time(self, n_p: Sequence[int], n_d: Sequence[int], decode_ctx: Sequence[int],
                       prefills: Sequence[tuple[int, int]],
                       decode_max: Sequence[int] | None = None) -> float:
        """T_iter of one iteration.

        n_p: prefill tokens per rank; n_d: decodes per rank; decode_ctx: Σ decode context per rank;
        prefills: (chunk ℓ_i, context c_i) of every scheduled chunk (their tokens are n_p's total);
        decode_max: each rank's longest decode context (optional, for `decode_fn`).
        """
        n = len(n_d)
        if n == 0 or len(n_p) != n or len(decode_ctx) != n:
            raise ValueError(f"n_p, n_d, decode_ctx: expected one entry per rank (>= 1), got "
                             f"{len(n_p)}, {len(n_d)}, {len(decode_ctx)}")
        max_tokens = max(p + d for p, d in zip(n_p, n_d))
        work = sum(prefill_work(ell, c) for ell, c in prefills if ell > 0)
        return self.combine(max_tokens, max(n_p), work, n,
                            self.decode_path(n_d, decode_ctx, decode_max))


CONTENTION_GRID = np.round(np.arange(1.0, 3.001, 0.02), 2)  # α, β ≥ 1: never a speed-up


def estimate_many(est: ConfluxEstimator, paths: np.ndarray, alpha, beta) -> np.ndarray:
    """T_iter (the estimator's unit) of every batch (rows of `paths`: T_GEMM, T_P, T_D from
    `ConfluxEstimator.paths`) for every (α, β) pair: shape (batches, pairs)."""
    g, p, d = (paths[:, k][:, None] for k in range(3))
    a, b = np.atleast_1d(alpha)[None, :], np.atleast_1d(beta)[None, :]
    serial = np.where(np.isnan(p), 0.0, p) + np.where(np.isnan(d), 0.0, d)
    if not est.overlap:
        attn = serial
    elif est.literal:
        attn = np.fmax(b * p, a * d)  # fmax skips the NaN of an empty path
    else:  # contention only where both paths run; a lone path costs its own time
        attn = np.where(np.isnan(p) | np.isnan(d), serial,
                        np.minimum(np.fmax(b * p, a * d), serial))
    return est.num_layers * (g + np.where(np.isnan(attn), 0.0, attn))


def fit_contention(est: ConfluxEstimator, paths: np.ndarray, measured,
                   grid: np.ndarray = CONTENTION_GRID) -> tuple[float, float]:
    """(α, β) on `grid` minimising the estimator's MAPE against `measured` iteration times of
    mixed batches (App. D: α, β are calibrated from mixed profiles)."""
    measured = np.asarray(measured, dtype=np.float64)
    A, B = (x.ravel() for x in np.meshgrid(grid, grid, indexing="ij"))
    pred = estimate_many(est, paths, A, B)
    k = int(np.argmin(np.mean(np.abs(pred - measured[:, None]) / measured[:, None], axis=0)))
    return float(A[k]), float(B[k])


def fit_affine(x, y, where: str = "samples") -> tuple[float, float]:
    """Non-negative least squares fit of y ≈ slope·x + intercept; returns (slope, intercept)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape or len(x) < 2:
        raise ConfigError(f"{where}: expected two equally long sequences of >= 2 points, got "
                          f"{len(x)} and {len(y)}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ConfigError(f"{where}: samples must be finite")
    scale = max(float(np.max(np.abs(x))), 1.0)  # conditioning: x spans up to ~1e9 for attention work
    (slope, intercept), _ = nnls(np.column_stack([x / scale, np.ones_like(x)]), y)
    return float(slope / scale), float(intercept)


def fit_estimator(samples: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
                  num_layers: int = 1, alpha: float = 1.0, beta: float = 1.0) -> ConfluxEstimator:
    """Fit the affine base functions from per-term (x, per-layer time) samples.

    Keys: "gemm" (rank-local tokens), "decode_attn" (Σ decode context on a rank), "prefill_attn"
    (per-rank prefill work, i.e. Σ ℓ(c + (ℓ+1)/2) / N), "comm" (largest prefill shard, tokens;
    both all-to-alls). α and β are contention factors calibrated separately (paper App. D).
    """
    unknown = set(samples) - set(TERMS)
    if unknown:
        raise ConfigError(f"fit_estimator: unknown term(s) {sorted(unknown)}; known: {sorted(TERMS)}")
    coef: dict[str, float] = {}
    for term, (slope_name, icpt_name) in TERMS.items():
        if term not in samples:
            raise ConfigError(f"fit_estimator: samples[{term!r}]: missing")
        xs, ys = samples[term]
        coef[slope_name], coef[icpt_name] = fit_affine(xs, ys, where=f"fit_estimator: samples[{term!r}]")
    return ConfluxEstimator(**coef, alpha=alpha, beta=beta, num_layers=num_layers)


def samples_from_functions(fns: Mapping[str, Callable[[float], float]],
                           grids: Mapping[str, Sequence[float]]) -> dict[str, tuple[list, list]]:
    """Evaluate base-latency functions (e.g. wrappers around simserve's cost model) on grids,
    giving the samples `fit_estimator` takes."""
    missing = set(fns) - set(grids)
    if missing:
        raise ConfigError(f"samples_from_functions: grids: missing {sorted(missing)}")
    return {k: (list(grids[k]), [float(f(x)) for x in grids[k]]) for k, f in fns.items()}
