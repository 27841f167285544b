# C types server.py's request path uses when Cython compiles it (setup.py; see
# http_server.pxd): ``@cython.locals`` there names these extension types.

from llmplane.gateway.context cimport RequestContext
from llmplane.gateway.http_server cimport HttpRequest
from llmplane.gateway.request cimport InferenceRequest
from llmplane.gateway.routing cimport Decision
