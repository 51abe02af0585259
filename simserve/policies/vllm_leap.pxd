# C types for the compiled copy of vllm_leap.py (simserve/compiled.py): the block counts'
# loops on C integers (floor division keeps Python's rounding: cdivision is off).
cimport cython
from libc.stdint cimport int64_t

@cython.locals(n=int64_t, r=int64_t)
cpdef int64_t new_blocks(list room, int64_t k, int64_t bs) except? -1

@cython.locals(n=int64_t, r=int64_t, s=int64_t)
cpdef int64_t new_blocks_upto(list room, list left, int64_t k, int64_t bs) except? -1

@cython.locals(n=Py_ssize_t, j=Py_ssize_t, s=int64_t, m=int64_t, x=int64_t)
cpdef tuple _suffix_sum_max(list c, list order)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=int64_t, y=int64_t)
cpdef object decoding(const int64_t[::1] comp, const int64_t[::1] blocks, const int64_t[::1] ntok,
                       const int64_t[::1] gen, list running, int64_t bs)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=int64_t, a=int64_t, s=int64_t, nb=int64_t)
cpdef int64_t advance_steps(int64_t[::1] cv, int64_t[::1] bv, list il, list c, list room, list steps,
                          int64_t k, int64_t bs, list short) except? -1
