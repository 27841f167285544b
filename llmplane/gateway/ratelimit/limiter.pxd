# C declarations for limiter.py when Cython compiles it (setup.py's hot path): the fast
# path's reservation is an extension type filled as C struct members, and the fast path
# reads the request and the plan as C structs and calls the plan's compiled
# loops directly (buckets.pxd).
cimport cython

from llmplane.gateway.hooks cimport Reservation as HookReservation
from llmplane.gateway.ratelimit.buckets cimport PlanState, reserve_levels, settle_levels
from llmplane.gateway.request cimport InferenceRequest


cdef class Reservation(HookReservation):
    cdef public object _taken, amounts, limit, plan


@cython.locals(reservation=Reservation)
cdef Reservation _fast(PlanState plan, object limit, list amounts)


cdef class RateLimiter:
    cdef public object config, clock, make_bucket, local, redis, counter, default_output
    cdef public object policy, _tasks, _children, rejections, redis_errors, degraded
    cdef public dict limits, tenant_limits
    cdef public tuple plans

    @cython.locals(plans=dict, plan=PlanState, amounts=list)
    cpdef _reserve_local(self, InferenceRequest inference, object decision, object limit,
                         list counted)
