# C declarations for http_server.py when Cython compiles it (setup.py): the per-request and
# per-connection objects become extension types whose fields compiled code reads and writes
# directly, instead of looking each name up through the type as for __slots__. The .py stays
# the source of truth and runs unchanged as pure Python.

cdef class HttpRequest:
    cdef public object _protocol
    cdef public object method
    cdef public object path
    cdef public object path_qs
    cdef public object headers
    cdef public object body
    cdef public object version
    cdef public object keep_alive
    cdef public object too_large


cdef class Response:
    cdef public object body
    cdef public object headers
    cdef public object raw_headers
    cdef public object status

    cpdef bytes encode(self, bint keep_alive, bint head, bytes date)


cdef class StreamResponse:
    cdef public bint _chunked
    cdef public _Protocol _protocol
    cdef public bint finished
    cdef public object headers
    cdef public bint prepared
    cdef public object raw_headers
    cdef public object status


cdef class _Protocol:
    cdef public object _body
    cdef public bint _complete
    cdef public object _drain
    cdef public bint _failed
    cdef public Py_ssize_t _head_left
    cdef public Py_ssize_t _header_bytes
    cdef public object _headers
    cdef public Py_ssize_t _heads
    cdef public bint _in_body
    cdef public object _more
    cdef public bint _read_paused
    cdef public object _refusal
    cdef public Py_ssize_t _size
    cdef public bint _too_large
    cdef public object _url
    cdef public bint busy
    cdef public bint closed
    cdef public object head_since
    cdef public object idle_since
    cdef public object parser
    cdef public object queue
    cdef public HttpServer server
    cdef public object task
    cdef public object transport
    cdef public bint write_paused

    cpdef bint _wake(self) except -1
    cpdef _fail(self, Response response)


cdef class HttpServer:
    cdef public dict routes
    cdef public dict allowed
    cdef public object fallback
    cdef public object max_body
    cdef public object keepalive_timeout
    cdef public object header_timeout
    cdef public object max_connections
    cdef public object guard
    cdef public object refused
    cdef public object timed_out
    cdef public set connections
    cdef public bint closing
    cdef public object idle
    cdef public bytes date
    cdef public object _server
    cdef public object _ticker
    cdef public object loop

    cpdef dispatch(self, HttpRequest request)
