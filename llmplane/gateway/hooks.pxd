# C declarations for hooks.py when Cython compiles it (setup.py's hot path): a hook's
# reservation is an extension type, which the rate limiter subclasses (ratelimit/limiter.pxd)
# and fills as C struct members on every limited request.

cdef class Reservation:
    cdef public object _headers, response_lines, stream_filter
