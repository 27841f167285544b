# C declarations for routing.py when Cython compiles it (setup.py; see http_server.pxd).

cdef class Decision:
    cdef public object backend
    cdef public object criticality
    cdef public object load
    cdef public object lora
    cdef public object model
    cdef public object route
    cdef public object tenant
