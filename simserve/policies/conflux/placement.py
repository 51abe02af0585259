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
    feasible = [r for r, s in enumerate(ranks)
                if s.kv_used_blocks + i_kv_blocks <= (1.0 - headroom) * s.kv_total_blocks]
    if not feasible:
        return None
    low = [r for r in feasible if ranks[r].kv_util < eta]
    if low:  # worst-fit: least decode context, then least KV in use
        return min(low, key=lambda r: (ranks[r].decode_ctx_tokens, ranks[r].kv_util, r))
    return min(feasible, key=lambda r: (-ranks[r].kv_util, r))  # best-fit
