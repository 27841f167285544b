# C declarations for context.py when Cython compiles it (setup.py; see http_server.pxd).

cdef class RequestContext:
    cdef public object attempts
    cdef public object bootstrap_room
    cdef public object decision
    cdef public object end
    cdef public object endpoint
    cdef public object error
    cdef public object events
    cdef public object failures
    cdef public object inference
    cdef public object pd
    cdef public object prefill_endpoint
    cdef public object prefill_ms
    cdef public object profile
    cdef public object request
    cdef public object response_headers
    cdef public object response_lines
    cdef public object sched_ms
    cdef public object scores
    cdef public object seat
    cdef public object sent_model
    cdef public object status
    cdef public object stream_filter
    cdef public object t0
    cdef public object tenant
    cdef public object ttft
    cdef public object upstream_broken
    cdef public object upstream_status
    cdef public object usage
    cdef public object waited
    cdef public object weight
