# C types for the compiled copy of requests.py (simserve/compiled.py): the per-request token
# loops on the table's arrays as C arrays (the int columns are int64, `long` here).
cimport cython

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=long)
cpdef list _emit_one(double[::1] tt, double[::1] first, long[::1] gen, long[::1] ntok,
                     const long[::1] off, const long[::1] out, list il, double t, long mask)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=long, n=long, a=Py_ssize_t)
cpdef void _write_runs(double[::1] tt, const double[::1] src, long[::1] gen, long[::1] ntok,
                       const long[::1] off, const long[::1] out, list il, list generated,
                       list steps, dict groups)
