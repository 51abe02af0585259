# C types for the compiled copy of gpu.py (simserve/compiled.py): the per-step pricing loops
# on C doubles, reading numpy's arrays in place. The same IEEE operations as the source
# (true division of two C integers converts each exactly, as Python's does below 2**53).
cimport cython
from libc.stdint cimport int64_t
cimport libc.math as math

@cython.locals(j=Py_ssize_t, b=double, scale=double, x=double, xe=double, v=double, f=double)
cpdef list _decode_step_times(const double[::1] base, const int64_t[::1] runs, Py_ssize_t m0,
                              Py_ssize_t e0, double rate, double dense, int64_t L, double lm,
                              double situ, double host, bint graph, bint overlap, double g,
                              double ov, double la)

@cython.locals(j=int64_t, yv=double[::1])
cpdef object _mean_contexts(int64_t ctx_sum0, int64_t B, int64_t k)

@cython.locals(j=Py_ssize_t)
cpdef void _blend(double[::1] r0, double a, const double[::1] r1, double w)
