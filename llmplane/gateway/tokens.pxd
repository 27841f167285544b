# C declarations for tokens.py when Cython compiles it (setup.py's hot path): the estimate is
# a C function too, which ``ratelimit/buckets.py``'s take calls directly (buckets.pxd).

cpdef object estimate_tokens(object doc)
