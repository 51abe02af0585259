# C types for the compiled copy of gpu.py (simserve/compiled.py): the per-step pricing loop
# on C doubles, reading numpy's arrays in place. The same IEEE operations as the source.
cimport cython
cimport libc.math as math

@cython.locals(j=Py_ssize_t, b=double, scale=double, x=double, xe=double, v=double, f=double)
cpdef list _decode_step_times(double[::1] base, const long[::1] lmx, const long[::1] leq,
                              double rate, double dense, long L, double lm, double situ,
                              double host, bint graph, bint overlap, double g, double ov,
                              double la)

@cython.locals(j=Py_ssize_t)
cpdef void _blend(double[::1] r0, double a, double[::1] r1, double w)
