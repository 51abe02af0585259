# C types for the compiled copy of attention.py (simserve/compiled.py): one decode step's
# unequal-context factor on C integers and doubles (the same IEEE operations; floor division
# keeps Python's rounding, cdivision is off).
cimport cython
cimport libc.math as math

@cython.locals(s=long)
cpdef long _longest_one(long m, long cap, long min_split, long block) except? -1

@cython.locals(eq=long, scale=double, x=double, xe=double)
cpdef double _factor1(long batch, long ctx_sum, long ctx_max, double base_us, long cap,
                      long min_split, long block, double rate) except? -1.0
