# C types for the compiled copy of vllm_engine.py (simserve/compiled.py): the per-request
# loops on the request table's int64 arrays as C arrays.
cimport cython

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, k=long, x=long, tok=long, s=bint, num_sample=long)
cpdef tuple _classify(const long[::1] comp, const long[::1] ntok, const long[::1] gen,
                      list il, list nl)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t)
cpdef list _advance(long[::1] comp, list il, list nl, list sample)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=long, y=long)
cpdef object _decoding(const long[::1] comp, const long[::1] blocks, const long[::1] ntok,
                       const long[::1] gen, list running, long bs)

@cython.locals(i=Py_ssize_t, r=Py_ssize_t, x=long, a=long, s=long, nb=long)
cpdef long _advance_steps(long[::1] cv, long[::1] bv, list il, list c, list room, list steps,
                          long k, long bs, list short) except? -1
