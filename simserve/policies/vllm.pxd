# C types for the compiled copy of vllm.py (simserve/compiled.py): the running batch's fit on
# the request table's int64 arrays as C arrays.
cimport cython
from libc.stdint cimport int64_t

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=int64_t, need=int64_t, n=int64_t, left=int64_t, nb=int64_t,
               total=int64_t, keep=bint)
cpdef object _running_fit(const int64_t[::1] comp, int64_t[::1] blocks, const int64_t[::1] ntok,
                          list run, int64_t budget, int64_t bs, int64_t free)
