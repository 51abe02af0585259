"""`SpCostModel` as ConfluxServe's instances run it: the same iteration times, with each rank's
decode-attention line (`SpCostModel.rank_attn`: a rank's decodes over consecutive steps) priced
by `decode_steps_us`, a third of the numpy calls of the general array path.

The line is asked for whenever a rank's decode set changes (a request joins or finishes), so
ConfluxServe builds about two per request; the general path prices each in ~100 µs, this one in
~35 µs. `decode_steps_us` gives the array call's floats (the same operations on the same values;
`GpuCostModel.decode_steps_s` and vLLM's leap rely on it), and tests/test_conflux_speed.py checks
the lines against `SpCostModel`'s.
"""
from __future__ import annotations

import numpy as np

from simserve.cost.sp import SpCostModel
from simserve.hardware.attention import decode_steps_us


class LineCostModel(SpCostModel):
    """`SpCostModel` whose decode-attention lines take `decode_steps_us`' fast path."""

    def _attn(self, b: int, ctx_sum: np.ndarray, ctx_max: np.ndarray) -> np.ndarray:
        fn, k = self.base._decode_fn, len(ctx_max)
        # rank_attn asks for consecutive steps (Σ context + b, longest + 1 per step) of the
        # profile's function; anything else takes the general path
        if k < 1 or getattr(self.base.decode_attn, "__self__", None) is not fn:
            return super()._attn(b, ctx_sum, ctx_max)
        s0, m0 = int(ctx_sum[0]), int(ctx_max[0])
        if int(ctx_max[-1]) != m0 + k - 1 or int(ctx_sum[-1]) != s0 + b * (k - 1):
            return super()._attn(b, ctx_sum, ctx_max)
        return np.asarray(decode_steps_us(fn, b, s0, m0, k), dtype=np.float64)
