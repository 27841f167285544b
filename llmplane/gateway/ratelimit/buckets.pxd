# C declarations for buckets.py when Cython compiles it (setup.py's hot path): the bucket's
# numbers as C doubles, the loops of a plan's take and settlement over them, and the header
# lines written into a C buffer.
cimport cython
from libc.string cimport memcpy

from llmplane.gateway.ratelimit.limits cimport output_reservation
from llmplane.gateway.tokens cimport estimate_tokens


cdef class TokenBucket:
    cdef public double burst, level, rate, stamp


cdef class HeaderLines:
    cdef public tuple codes, ends, limit_texts, limits
    cdef public bytes text

    @cython.locals(buf=cython.char[4096], n=Py_ssize_t, start=Py_ssize_t, end=Py_ssize_t,
                   i=Py_ssize_t, j=Py_ssize_t, code=int, scarcest=Py_ssize_t,
                   share=cython.double, x=cython.double, level=cython.double,
                   limit=cython.double, whole=cython.longlong, b=TokenBucket, codes=tuple,
                   limits=tuple, limit_texts=tuple, ends=tuple, text=bytes, limit_text=bytes)
    cpdef object render(self, tuple buckets, list levels)


@cython.locals(b=TokenBucket, level=cython.double, stamp=cython.double, a=cython.double,
               i=Py_ssize_t, n=Py_ssize_t, short=bint, levels=list)
cpdef list take_levels(tuple buckets, list amounts, double now)


cdef class PlanState:
    cdef public list _levels
    cdef public tuple amount_kinds, bucket_list
    cdef public HeaderLines header_lines
    cdef public bytes lines
    cdef public object count, default
    cdef public tuple kinds
    cdef public bint loops


@cython.locals(b=TokenBucket, level=cython.double, stamp=cython.double, taken=cython.double,
               i=Py_ssize_t, n=Py_ssize_t, short=bint, same=bint, levels=list, amounts=list,
               buckets=tuple, kind=int, last=list, h=HeaderLines, lines=object,
               count=object, default=object)
cpdef list reserve_levels(PlanState plan, object doc, object model, object sent, double now,
                          list counted)


@cython.locals(b=TokenBucket, level=cython.double, burst=cython.double, t=cython.double,
               i=Py_ssize_t, kind=int)
cpdef settle_levels(tuple buckets, tuple kinds, object give, list amounts, object prompt,
                    object completion, int status, object clock)


cdef Py_ssize_t _put_text(char *buf, Py_ssize_t n, bytes text, Py_ssize_t start, Py_ssize_t end)


@cython.locals(start=Py_ssize_t, end=Py_ssize_t, c=cython.char)
cdef Py_ssize_t _put_int(char *buf, Py_ssize_t n, long long value)


@cython.locals(m=cython.double, part=cython.double, thousandths=cython.longlong,
               tens=cython.longlong)
cdef Py_ssize_t _put_seconds(char *buf, Py_ssize_t n, double seconds)


@cython.locals(m=cython.double, ms=cython.longlong, rest=cython.double, minutes=cython.longlong)
cdef Py_ssize_t _put_reset(char *buf, Py_ssize_t n, double seconds)
