"""Launch parameters of the split-K paged decode kernel (`triton_kernels.paged_decode`), torch-
free so that the cost model's imbalance term (`hardware.attention.SplitImbalance`) can name them."""
DECODE_PROGRAMS_PER_SM = 4   # programs the split count aims for, per streaming multiprocessor
DECODE_MIN_SPLIT = 256       # no split shorter than this many tokens
