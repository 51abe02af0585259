"""ConfluxServe's decode placement (Alg. 3) in one pass over the ranks' columns
(`placement.place_on`, which `place_decode` and the plan call) picks the rank that the rule as
first written picks: the feasible ranks, worst-fit by (decode context, utilisation, index)
below η, else best-fit by (−utilisation, index)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.policies.conflux.dispatch import RankState
from simserve.policies.conflux.placement import place_decode


def _first_written(blocks, ranks, eta, headroom):
    feasible = [r for r, s in enumerate(ranks)
                if s.kv_used_blocks + blocks <= (1.0 - headroom) * s.kv_total_blocks]
    if not feasible:
        return None
    low = [r for r in feasible if ranks[r].kv_util < eta]
    if low:
        return min(low, key=lambda r: (ranks[r].decode_ctx_tokens, ranks[r].kv_util, r))
    return min(feasible, key=lambda r: (-ranks[r].kv_util, r))


# few distinct values, so that ties in context and utilisation are common
rank = st.builds(lambda c, u, n: RankState(0, c, min(u, n), n, 0), st.sampled_from([0, 5, 9]),
                 st.sampled_from([0, 1, 40, 50, 80, 100]), st.sampled_from([0, 50, 100]))


@settings(max_examples=400, deadline=None)
@given(st.lists(rank, min_size=1, max_size=6), st.sampled_from([0, 1, 10, 60]),
       st.sampled_from([0.0, 0.5, 0.8, 1.0]), st.sampled_from([0.0, 0.05, 0.5]))
def test_place_decode_is_the_rule_as_first_written(ranks, blocks, eta, headroom):
    assert place_decode(blocks, ranks, eta, headroom) == _first_written(blocks, ranks, eta,
                                                                        headroom)
