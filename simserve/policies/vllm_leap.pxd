# C types for the compiled copy of vllm_leap.py (simserve/compiled.py): the block counts'
# loops on C integers (floor division keeps Python's rounding: cdivision is off).
cimport cython

@cython.locals(n=long, r=long)
cpdef long new_blocks(list room, long k, long bs) except? -1

@cython.locals(n=long, r=long, s=long)
cpdef long new_blocks_upto(list room, list left, long k, long bs) except? -1

@cython.locals(n=Py_ssize_t, j=Py_ssize_t, s=long, m=long, x=long)
cpdef tuple _suffix_sum_max(list c, list order)
