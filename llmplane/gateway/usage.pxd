# C types for usage.py when Cython compiles it (setup.py; see http_server.pxd): the scan for
# the usage object indexes the response bytes as C chars.

import cython


@cython.locals(idx=Py_ssize_t, j=Py_ssize_t, n=Py_ssize_t, k=Py_ssize_t)
cpdef extract_usage(bytes data)
