# C declarations for buckets.py when Cython compiles it (setup.py's hot path): the bucket's
# numbers as C doubles, and the loops of a plan's take and settlement over them.
cimport cython


cdef class TokenBucket:
    cdef public double burst, level, rate, stamp


@cython.locals(b=TokenBucket, level=cython.double, stamp=cython.double, a=cython.double,
               i=Py_ssize_t, n=Py_ssize_t, short=bint, levels=list)
cpdef list take_levels(tuple buckets, list amounts, double now)


@cython.locals(b=TokenBucket, level=cython.double, stamp=cython.double, taken=cython.double,
               i=Py_ssize_t, n=Py_ssize_t, short=bint, same=bint, levels=list, amounts=list,
               buckets=tuple, kind=int, last=list)
cpdef list reserve_levels(object plan, object doc, object count, object model, object sent,
                          object out, object default, double now, list counted)


@cython.locals(b=TokenBucket, level=cython.double, burst=cython.double, t=cython.double,
               i=Py_ssize_t, kind=int)
cpdef settle_levels(tuple buckets, tuple kinds, object give, list amounts, object prompt,
                    object completion, int status, object clock)
