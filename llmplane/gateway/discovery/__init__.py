"""Discovery: the gateway's view of ready model-server endpoints (``sources``: the protocol and
the simple sources; ``pods``: Kubernetes Pods; ``store_endpoints``: ``Endpoint`` store objects).
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
