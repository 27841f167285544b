# C declarations for upstream_client.py when Cython compiles it (setup.py; see http_server.pxd).

cdef int _IDLE, _HEAD, _BODY, _DONE
cdef int _LENGTH, _CHUNKED, _UNTIL_CLOSE, _EMPTY


cdef class UpstreamResponse:
    cdef public _Connection _conn
    cdef public object headers
    cdef public object status


cdef class _Connection:
    cdef public object _body_left
    cdef public object _buf
    cdef public object _chunk_left
    cdef public object _closed_exc
    cdef public bint _done
    cdef public object _head_waiter
    cdef public bint _interim
    cdef public bint _keep_alive
    cdef public int _mode
    cdef public object _piece_waiter
    cdef public object _pieces
    cdef public int _state
    cdef public object _status
    cdef public bint _whole
    cdef public double idle_since
    cdef public object key
    cdef public object loop
    cdef public UpstreamPool pool
    cdef public object transport

    cpdef _whole_read(self, data)
    cpdef _parse(self)
    cpdef _parse_chunked(self)
    cpdef bint _head(self, head) except -1
    cpdef _push(self, piece)
    cpdef _finish_body(self)
    cpdef _fail(self, err)
    cpdef _wake_all(self)
    cpdef exchange(self, data)
    cpdef finish(self)


cdef class UpstreamPool:
    cdef public object limit
    cdef public object keepalive_timeout
    cdef public object connect_timeout
    cdef public object on_resend
    cdef public object resends
    cdef public dict _idle
    cdef public set _open
    cdef public object _waiters
    cdef public bint _closed
    cdef public object _deadlines

    cpdef _Connection _idle_one(self, address)
    cpdef _release(self, _Connection conn)
    cpdef _discard(self, _Connection conn)
    cpdef _forget(self, _Connection conn)
    cpdef _wake(self)
