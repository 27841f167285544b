"""An Envoy bootstrap that puts llmplane's endpoint picker in front of a pool of replicas.

The shape the Gateway API Inference Extension gives a data plane, written out for a plain Envoy
(``deploy/envoy/envoy.yaml`` is this with example addresses):

- an early header mutation drops any ``x-gateway-destination-endpoint`` the client sent before
  the route is chosen, so only the picker can choose where a request goes;
- the ``ext_proc`` filter sends the request headers and the buffered body to the picker, and
  the response headers and body chunks back to it (usage, in-flight accounting);
  ``failure_mode_allow`` is InferencePool ``extensionRef.failureMode`` (FailOpen = true);
- a request that carries the picker's header goes to an ORIGINAL_DST cluster that connects to
  the address in that header; any other request (picker down with FailOpen, or a request the
  picker left alone such as ``GET /v1/models``) goes to a round-robin cluster of the pool;
- the endpoint that served goes back to the picker as the protocol asks, in the response's
  ``envoy.lb`` metadata under ``x-gateway-destination-endpoint-served``: the picked route adds
  it as a response header from ``%UPSTREAM_HOST%`` (replacing one an engine sent), and a
  header-to-metadata filter, which sees the response before ``ext_proc``, moves it into the
  metadata and off the response.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

DESTINATION_HEADER = "x-gateway-destination-endpoint"
METADATA_NAMESPACE = "envoy.lb"
# The data plane may restrict the pick to a subset of the pool (endpoint-picker protocol).
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
# The data plane reports which of the named endpoints served (after retries down the list).
SERVED_KEY = "x-gateway-destination-endpoint-served"
# The listener's buffer (a BUFFERED body must fit): the gateway's default body limit.
BOOTSTRAP_MAX_BODY = 16 * 1024 * 1024

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_EARLY_MUTATION = (
    "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3."
    "HeaderMutation"
)
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HEADER_TO_METADATA = (
    "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config"
)
_HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def fail_open(pool: dict[str, Any]) -> bool:
    """``failure_mode_allow`` for an InferencePool: its picker's ``failureMode`` is FailOpen
    (the API's default is FailClose); v1's ``endpointPickerRef``, v1alpha2's ``extensionRef``."""
    spec = pool.get("spec") or {}
    ref = spec.get("endpointPickerRef") or spec.get("extensionRef") or {}
    return ref.get("failureMode", "FailClose") == "FailOpen"


def _socket(address: str) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address.rpartition(":")[0].strip("[]"))
    except ValueError:
        return False
    return True


def _static_cluster(
    name: str, addresses: Sequence[str], http2: bool = False, lb: str = "ROUND_ROBIN"
) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC" if all(_is_ip(a) for a in addresses) else "STRICT_DNS",
        "connect_timeout": "2s",
        "lb_policy": lb,
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket(a)}} for a in addresses]}
            ],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def bootstrap(
    *,
    listen: str,
    picker: str,
    pool: Sequence[str],
    fail_open: bool = True,
    admin: str = "127.0.0.1:0",
    message_timeout: str = "5s",
    max_body: int = BOOTSTRAP_MAX_BODY,
    full_duplex: bool = False,
) -> dict[str, Any]:
    """The bootstrap as a dict (write it as JSON or YAML; Envoy reads both).

    ``listen``, ``picker`` and ``admin`` are ``host:port`` (port 0: any free port, which
    Envoy reports on its admin ``/listeners``); ``pool`` is the replicas' ``ip:port`` list the
    FailOpen route balances over. A host name (the picker's Service) makes a STRICT_DNS
    cluster. ``full_duplex``: bodies FULL_DUPLEX_STREAMED both ways (with trailers), the mode
    the Inference Extension's Gateway implementations configure, instead of the request body
    BUFFERED and the response body STREAMED.
    """
    ext_proc = {
        "@type": _EXT_PROC,
        "grpc_service": {"envoy_grpc": {"cluster_name": "llmplane_epp"}},
        "failure_mode_allow": fail_open,
        "message_timeout": message_timeout,
        # A subset hint another filter (or the Gateway implementation) sets, and the endpoint
        # that served (``envoy.lb``), reach the picker.
        "metadata_options": {
            "forwarding_namespaces": {"untyped": [SUBSET_NAMESPACE, METADATA_NAMESPACE]}
        },
        "processing_mode": {
            "request_header_mode": "SEND",
            "request_body_mode": "FULL_DUPLEX_STREAMED" if full_duplex else "BUFFERED",
            "request_trailer_mode": "SEND" if full_duplex else "SKIP",
            "response_header_mode": "SEND",
            "response_body_mode": "FULL_DUPLEX_STREAMED" if full_duplex else "STREAMED",
            "response_trailer_mode": "SEND" if full_duplex else "SKIP",
        },
    }
    # Before the route is chosen: a client-sent destination never selects the picked route.
    strip = {
        "name": "envoy.http.early_header_mutation.header_mutation",
        "typed_config": {"@type": _EARLY_MUTATION, "mutations": [{"remove": DESTINATION_HEADER}]},
    }
    # The served endpoint: response header (the picked route's) -> envoy.lb metadata.
    served = {
        "@type": _HEADER_TO_METADATA,
        "response_rules": [
            {
                "header": SERVED_KEY,
                "on_header_present": {
                    "metadata_namespace": METADATA_NAMESPACE,
                    "key": SERVED_KEY,
                    "type": "STRING",
                },
                "remove": True,
            }
        ],
    }
    routes = [
        {
            "match": {
                "prefix": "/",
                "headers": [{"name": DESTINATION_HEADER, "present_match": True}],
            },
            "route": {"cluster": "llm_pool_picked", "timeout": "0s"},
            "response_headers_to_add": [
                {
                    "header": {"key": SERVED_KEY, "value": "%UPSTREAM_HOST%"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                }
            ],
        },
        {"match": {"prefix": "/"}, "route": {"cluster": "llm_pool", "timeout": "0s"}},
    ]
    hcm = {
        "@type": _HCM,
        "stat_prefix": "llm",
        "early_header_mutation_extensions": [strip],
        "route_config": {
            "name": "llm",
            "virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": routes}],
        },
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {"name": "envoy.filters.http.header_to_metadata", "typed_config": served},
            {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}},
        ],
    }
    picked = {
        "name": "llm_pool_picked",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "2s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
    }
    return {
        "admin": {"address": _socket(admin)},
        "static_resources": {
            "listeners": [
                {
                    "name": "llm",
                    "address": _socket(listen),
                    # The picker sees the whole body (BUFFERED): room for long prompts.
                    "per_connection_buffer_limit_bytes": max_body,
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                picked,
                _static_cluster("llm_pool", pool),
                _static_cluster("llmplane_epp", [picker], http2=True),
            ],
        },
    }
