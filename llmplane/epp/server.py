"""The endpoint picker's lifecycle: the gateway's routing state plus a gRPC ext_proc server.

gRPC health checking (``grpc.health.v1``) answers for the process, ``liveness``, ``readiness``
and the ext_proc service, as the endpoint-picker protocol asks. The routing state is the
gateway's own (``Gateway.start_routing``: the store or the Kubernetes
API for routing objects, the discovered endpoints, the scraper, the rate limiter), so the
picker and ``llmplane gateway`` decide alike from the same sources. ``/metrics`` and
``/health`` are served over HTTP on a port of their own when asked (``metrics_port``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc  # type: ignore[import-not-found]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from llmplane.epp.envoy import BOOTSTRAP_MAX_BODY
from llmplane.epp.picker import EndpointPickerService
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Discovery
from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.http_server import HttpRequest, HttpServer, Response
from llmplane.gateway.server import Gateway
from llmplane.store.base import Store

log = logging.getLogger("llmplane.epp")

# gRPC health services (the endpoint-picker protocol's): the process, its readiness to pick,
# and the ext_proc service itself. All SERVING once the routing state has its first view.
HEALTH_SERVICES = ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")


class EndpointPicker:
    def __init__(
        self,
        store: Store | None,
        discovery: Discovery,
        config: GatewayConfig | None = None,
        fallbacks: int = 0,
        wake: Callable[[str], None] | None = None,
    ) -> None:
        self.gateway = Gateway(store, discovery, config, wake=wake)
        self.service = EndpointPickerService(self.gateway, fallbacks)
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.http: HttpServer | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.metrics_port: int | None = None

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, metrics_port: int | None = None
    ) -> None:
        await self.gateway.start_routing()
        # A message carries a whole request body (BUFFERED) and the rewritten body back: room
        # for the gateway's body limit, and at least for the 16 MiB Envoy buffers with the
        # bootstrap's defaults, so a body over a lower limit still gets the picker's 413
        # (gRPC's own default, 4 MiB, would end the stream instead).
        limit = max(self.gateway.config.max_body_bytes, BOOTSTRAP_MAX_BODY) + 65536
        server = self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
            ]
        )
        external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(self.service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        bound = server.add_insecure_port(f"{host}:{port}")
        if not bound:
            raise OSError(f"cannot listen on {host}:{port}")
        await server.start()
        for name in HEALTH_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.host, self.port = host, bound
        if metrics_port is not None:
            self.http = HttpServer(
                {
                    ("GET", "/metrics"): self.gateway.prometheus,  # behind the admin key
                    ("GET", "/health"): self._health,
                    # The operator's autoscaler reads the in-cluster data plane's load here.
                    ("GET", "/autoscaling/signals"): self.gateway.autoscaling_signals,
                },
                self._not_found,
                max_body=1024,
            )
            self.metrics_port = await self.http.start(host, metrics_port)
        log.info("endpoint picker listening on %s:%d", host, bound)

    async def close(self, grace: float = 5.0) -> None:
        if self.server is not None:
            await self.health.enter_graceful_shutdown()  # NOT_SERVING while draining
            await self.server.stop(grace)
            self.server = None
        if self.http is not None:
            await self.http.close(0)
            self.http = None
        await self.gateway.close()

    async def _health(self, request: HttpRequest) -> Response:
        return Response(body=b'{"status":"ok"}', content_type="application/json")

    async def _not_found(self, request: HttpRequest) -> Response:
        return GatewayError(404, f"no such path: {request.path}", ErrorCode.NOT_FOUND).response()


async def start_picker(
    store: Store | None,
    discovery: Discovery,
    host: str = "127.0.0.1",
    port: int = 0,
    config: GatewayConfig | None = None,
    *,
    fallbacks: int = 0,
    metrics_port: int | None = None,
    message_timeout: float = 5.0,
    wake: Callable[[str], None] | None = None,
) -> EndpointPicker:
    """Start a picker on ``host:port`` (0 = any free port; see ``picker.port``).

    ``message_timeout``: the calling Envoy's ext_proc ``message_timeout`` in seconds (5 s in
    ``llmplane.epp.envoy``'s bootstrap); flow control's TTL is kept below it.
    """
    config = within_message_timeout(config or GatewayConfig(), message_timeout)
    picker = EndpointPicker(store, discovery, config, fallbacks, wake)
    try:
        await picker.start(host, port, metrics_port)
    except BaseException:
        await picker.close(0)
        raise
    return picker


def within_message_timeout(config: GatewayConfig, message_timeout: float) -> GatewayConfig:
    """``config`` with a flow-control TTL that ends before Envoy's ext_proc message timeout.

    Envoy waits ``message_timeout`` for the picker's answer to each message, then fails the
    request (FailClose) or routes it without a pick (FailOpen: onto the saturated engines flow
    control was protecting). A queued request must therefore get its 429 from the picker
    first: the TTL is capped at nine tenths of the timeout (a tenth for the answer's trip).
    """
    cap = message_timeout * 0.9
    if config.flow_control_ttl <= cap:
        return config
    return dataclasses.replace(config, flow_control_ttl=cap)
