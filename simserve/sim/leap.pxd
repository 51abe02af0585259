# C types for the compiled copy of leap.py (simserve/compiled.py): a leap's end times summed
# as C doubles (the same IEEE additions, in order).
cimport cython

@cython.locals(x=double)
cpdef double _append_ends(list ends, list d, double e) except? -1.0
