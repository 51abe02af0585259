"""The Table 2 harness (benchmarks/conflux_table2.py): chunked prefill's token budget is swept
and the best budget meeting the TBT criterion is kept, as the paper does."""
from __future__ import annotations

from benchmarks.conflux_table2 import chunked_sweep, measure
from tests.sp_hand import HW4


def test_chunked_budget_sweep_keeps_the_best_budget_meeting_tbt():
    # at 50 ms a 4,096-token budget next to 96 decodes at 8K is far over τ, 512 well within
    big = measure("chunked", dict(max_num_batched_tokens=4096), 50.0, 4.0, HW4)
    assert not big["meets_tbt"] and big["p99_itl_ms"] > 75.0
    best = chunked_sweep(50.0, 4.0, HW4, budgets=[512, 768, 4096])
    assert best["meets_tbt"] and best["p99_itl_ms"] <= 50.0
    assert best["budget"] == 768  # the larger passing budget prefills more
    assert best["tok_s"] > 0 and best["stalled"] == 0
    assert [b for b, *_ in best["sweep"]] == [512, 768, 4096]
