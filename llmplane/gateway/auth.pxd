# C declarations for auth.py when Cython compiles it (setup.py's hot path): the tenant, the
# tenant table and the authenticator are extension types, so a request's key check reads
# their fields as C struct members.
cimport cython


cdef class Tenant:
    cdef public object name, models, criticality, weight, _exact, _pattern
    cdef public dict _verdicts


cdef class TenantTable:
    cdef public dict keys, verified
    cdef public object names, tenants


cdef class Authenticator:
    cdef public TenantTable table
    cdef public object requests, admin
    cdef public bint loopback
