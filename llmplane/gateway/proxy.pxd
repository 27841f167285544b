# C declarations for proxy.py when Cython compiles it (setup.py; see http_server.pxd).

from llmplane.gateway.context cimport RequestContext


cdef class Attempts:
    cdef public object budget
    cdef public RequestContext ctx
    cdef public object interval
    cdef public object last
    cdef public object retries
    cdef public object what
