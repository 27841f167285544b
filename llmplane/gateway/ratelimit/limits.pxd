# C declarations for limits.py when Cython compiles it (setup.py's hot path): the output
# reservation is a C function too, which ``buckets.py``'s take calls directly (buckets.pxd).

cpdef object output_reservation(object doc, object default, object burst)
