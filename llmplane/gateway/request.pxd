# C declarations for request.py when Cython compiles it (setup.py; see http_server.pxd).

cdef class InferenceRequest:
    cdef public object _prompt
    cdef public object body
    cdef public object dirty
    cdef public object doc
    cdef public object headers
    cdef public object model
    cdef public object path
    cdef public object stream
