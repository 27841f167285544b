"""Discovery: the gateway's view of ready model-server endpoints and their labels.

``sources`` (the ``Discovery`` protocol; static, embedded-runtime and combined sources),
``pods`` (Kubernetes Pods, in-cluster) and ``store_endpoints`` (``Endpoint`` objects registered
in the store: servers running elsewhere). The endpoint type itself is the runtime's
(``llmplane.runtime.endpoint.Endpoint``).
"""

from llmplane.gateway.discovery.sources import (
    CombinedDiscovery,
    Discovery,
    Following,
    RuntimeDiscovery,
    StaticDiscovery,
    Subscribers,
)
from llmplane.runtime.endpoint import Endpoint

__all__ = [
    "CombinedDiscovery",
    "Discovery",
    "Endpoint",
    "Following",
    "RuntimeDiscovery",
    "StaticDiscovery",
    "Subscribers",
]
