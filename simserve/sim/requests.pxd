# C types for the compiled copy of requests.py (simserve/compiled.py): the per-request token
# loops on the table's arrays as C arrays (the int columns are int64).
cimport cython
from libc.stdint cimport int64_t

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=int64_t)
cpdef list _emit_one(double[::1] tt, double[::1] first, int64_t[::1] gen, int64_t[::1] ntok,
                     const int64_t[::1] off, const int64_t[::1] out, list il, double t, int64_t mask)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=int64_t, n=int64_t, a=Py_ssize_t)
cpdef void _write_runs(double[::1] tt, const double[::1] src, int64_t[::1] gen, int64_t[::1] ntok,
                       const int64_t[::1] off, const int64_t[::1] out, list il, list generated,
                       list steps, dict groups)
