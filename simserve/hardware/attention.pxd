# C types for the compiled copy of attention.py (simserve/compiled.py): one decode step's
# unequal-context factor on C integers and doubles (the same IEEE operations; floor division
# keeps Python's rounding, cdivision is off).
cimport cython
from libc.stdint cimport int64_t
cimport libc.math as math

@cython.locals(s=int64_t)
cpdef int64_t _longest_one(int64_t m, int64_t cap, int64_t min_split, int64_t block) except? -1

@cython.locals(eq=int64_t, scale=double, x=double, xe=double)
cpdef double _factor1(int64_t batch, int64_t ctx_sum, int64_t ctx_max, double base_us, int64_t cap,
                      int64_t min_split, int64_t block, double rate) except? -1.0
