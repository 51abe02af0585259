# C types for the compiled copy of gpu.py (simserve/compiled.py): the per-step pricing loops
# on C doubles, reading numpy's arrays in place. The same IEEE operations as the source
# (true division of two C integers converts each exactly, as Python's does below 2**53).
cimport cython
cimport libc.math as math

@cython.locals(j=Py_ssize_t, b=double, scale=double, x=double, xe=double, v=double, f=double)
cpdef list _decode_step_times(const double[::1] base, const long[::1] runs, Py_ssize_t m0,
                              Py_ssize_t e0, double rate, double dense, long L, double lm,
                              double situ, double host, bint graph, bint overlap, double g,
                              double ov, double la)

@cython.locals(j=long, yv=double[::1])
cpdef object _mean_contexts(long ctx_sum0, long B, long k)

@cython.locals(j=Py_ssize_t)
cpdef void _blend(double[::1] r0, double a, const double[::1] r1, double w)
