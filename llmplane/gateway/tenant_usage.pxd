# C declarations for tenant_usage.py when Cython compiles it (setup.py's hot path): the hook
# and a tenant/model's series are extension types, so a request's counting reads their
# fields as C struct members.
cimport cython


cdef class _Series:
    cdef public object requests, input, output, counts, batch
    cdef public double until


cdef class TenantUsage:
    cdef public object log, flush_interval, clock, requests, tokens, pending, _task
    cdef public dict _series
