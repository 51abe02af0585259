# C types for the compiled copy of vllm.py (simserve/compiled.py): the running batch's fit on
# the request table's int64 arrays as C arrays.
cimport cython

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=long, need=long, n=long, left=long, nb=long,
               total=long, keep=bint)
cpdef object _running_fit(const long[::1] comp, long[::1] blocks, const long[::1] ntok,
                          list run, long budget, long bs, long free)
