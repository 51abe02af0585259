# C types for the compiled copy of vllm_engine.py (simserve/compiled.py): the per-request
# loops on the request table's int64 arrays as C arrays.
cimport cython
from libc.stdint cimport int64_t

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, k=int64_t, x=int64_t, tok=int64_t, s=bint, num_sample=int64_t)
cpdef tuple _classify(const int64_t[::1] comp, const int64_t[::1] ntok, const int64_t[::1] gen,
                      list il, list nl)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t)
cpdef list _advance(int64_t[::1] comp, list il, list nl, list sample)
