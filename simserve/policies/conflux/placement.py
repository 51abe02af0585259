"""Dual-mode decode placement (policies.md §7.4; paper Alg. 3, App. F).

When a chunk finishes a prefill, its whole KV moves to one rank, where the request decodes.
Worst-fit (least total decode context) while some feasible rank is below the utilisation
threshold η spreads decode attention evenly (T_D is a max over ranks); once every feasible rank
is above η, best-fit (most utilised rank that still fits) packs KV to keep large free regions.
"""
from __future__ import annotations

from typing import Sequence

from simserve.errors import ConfigError
from simserve.policies.conflux.dispatch import RankState

# The paper leaves η and h unspecified (policies.md §10); both are exposed for sweeps.
# η = 0.8: below 80% of the pool, spreading costs nothing in admissible KV, and it is where
# paged-KV servers typically start to see placement failures from fragmentation, so packing
# pays only beyond it.
DEFAULT_ETA = 0.8
# h = 0.05 of a rank's pool kept free after the placement: room for the resident decodes to
# grow (one token per iteration each, i.e. a block per 16 iterations per request) until the
# next placements, without preempting anything on the chosen rank.
DEFAULT_HEADROOM = 0.05


def place_decode(i_kv_blocks: int, ranks: Sequence[RankState], eta: float = DEFAULT_ETA,
                 headroom: float = DEFAULT_HEADROOM) -> int | None:
    """Rank index to host a request needing `i_kv_blocks` KV blocks, or None if none can.

    `ranks` is the tentative state (including placements reserved earlier this iteration).
    Feasible: used + i_kv_blocks <= (1 − headroom) · total. Utilisation is before placement.
    Ties go to the lower rank index.
    """
    if not 0.0 <= eta <= 1.0:
        raise ConfigError(f"place_decode: eta: expected a fraction in [0, 1], got {eta!r}")
    if not 0.0 <= headroom < 1.0:
        raise ConfigError(f"place_decode: headroom: expected a fraction in [0, 1), got {headroom!r}")
    if i_kv_blocks < 0:
        raise ConfigError(f"place_decode: i_kv_blocks: expected >= 0, got {i_kv_blocks!r}")
    return place_on(i_kv_blocks, [s.decode_ctx_tokens for s in ranks],
                    [s.kv_used_blocks for s in ranks], [s.kv_total_blocks for s in ranks], eta,
                    headroom)


def place_on(i_kv_blocks: int, ctx: Sequence[int], used: Sequence[int], total: Sequence[int],
             eta: float, headroom: float) -> int | None:
    """`place_decode` on the ranks' columns (Σ decode context, KV blocks in use, pool size),
    its arguments already checked: one pass instead of the lists, keys and `kv_util`
    properties (the same comparisons; a strict `<` or `>` keeps the lower index on ties)."""
    lim = 1.0 - headroom
    low = fit = None
    for r, (c, u, n) in enumerate(zip(ctx, used, total)):
        if u + i_kv_blocks > lim * n:
            continue                      # infeasible
        util = u / n if n > 0 else 1.0    # RankState.kv_util
        if util < eta:                    # worst-fit: least decode context, then least KV
            if low is None or (c, util) < low_key:
                low, low_key = r, (c, util)
        elif low is None and (fit is None or util > fit_util):  # best-fit: most KV in use
            fit, fit_util = r, util
    return low if low is not None else fit


def first_fit_on(i_kv_blocks: int, ctx: Sequence[int], used: Sequence[int],
                 total: Sequence[int], eta: float, headroom: float) -> int | None:
    """A placement blind to decode load (what `placement: first-fit` runs, the what-if that
    measures dual-mode placement): the lowest-index rank where the KV fits with the
    headroom kept; `eta` is not used."""
    lim = 1.0 - headroom
    for r, (u, n) in enumerate(zip(used, total)):
        if u + i_kv_blocks <= lim * n:
            return r
    return None


# `placement:` option -> the rule, with `place_on`'s signature: (KV blocks of the request,
# Σ decode context / KV blocks in use / pool size per rank, η, h) -> rank index or None
PLACEMENTS = {"dual-mode": place_on, "first-fit": first_fit_on}
