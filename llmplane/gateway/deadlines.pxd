# C declarations for deadlines.py when Cython compiles it (setup.py; see http_server.pxd).

cdef class Deadlines:
    cdef public object loop
    cdef public dict pending
    cdef public object _timer
    cdef public double _timer_at


cdef class Deadline:
    cdef public object _cancelling
    cdef public Deadlines _owner
    cdef public object _task
    cdef public bint expired
    cdef public object seconds
