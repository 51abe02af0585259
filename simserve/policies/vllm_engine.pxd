# C types for the compiled copy of vllm_engine.py (simserve/compiled.py): the per-request
# loops on the request table's int64 arrays as C arrays.
cimport cython
from libc.stdint cimport int64_t

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, k=int64_t, x=int64_t, tok=int64_t, s=bint, num_sample=int64_t)
cpdef tuple _classify(const int64_t[::1] comp, const int64_t[::1] ntok, const int64_t[::1] gen,
                      list il, list nl)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t)
cpdef list _advance(int64_t[::1] comp, list il, list nl, list sample)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=int64_t, y=int64_t)
cpdef object _decoding(const int64_t[::1] comp, const int64_t[::1] blocks, const int64_t[::1] ntok,
                       const int64_t[::1] gen, list running, int64_t bs)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=int64_t, a=int64_t, s=int64_t, nb=int64_t)
cpdef int64_t _advance_steps(int64_t[::1] cv, int64_t[::1] bv, list il, list c, list room, list steps,
                          int64_t k, int64_t bs, list short) except? -1
