"""``llmplane epp``: the endpoint picker on its own, for Envoy's ext_proc filter.

Routes and endpoints come from the state directory's store (``--state-dir``) or, in-cluster,
from the Kubernetes API (``--kubernetes``), exactly as for ``llmplane gateway``. Prints
``LISTENING host:port`` once it serves; SIGINT / SIGTERM stop it gracefully. A problem the user
can fix (missing extra, bad ``--config``, busy port, no Kubernetes API) is one line on stderr
and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Sequence

from llmplane.gateway.cli import (
    StartupError,
    add_routing_arguments,
    configure,
    listen_error,
    routing_sources,
    until_signalled,
)
from llmplane.gateway.config import ConfigFileError, GatewayConfig

DEFAULT_PORT = 9002  # InferencePool.spec.extensionRef's default port


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmplane epp",
        description="Serve Envoy's ext_proc protocol as a Gateway API Inference Extension "
        "endpoint picker, routing with llmplane's routing state and scheduler.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="gRPC port (0: any free)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics, /health and /autoscaling/signals on this port",
    )
    parser.add_argument(
        "--fallbacks",
        type=int,
        default=0,
        help="endpoints to name after the chosen one (comma-separated) for data planes that "
        "retry down the list; an ORIGINAL_DST cluster follows one address: keep 0 there",
    )
    parser.add_argument(
        "--message-timeout",
        type=float,
        default=5.0,
        help="seconds: the ext_proc filter's message_timeout in the Envoy that calls this "
        "picker (5 s in `llmplane.epp.envoy`'s bootstrap); a request waiting in flow control "
        "is answered (429) before it, so Envoy never gives up on the picker first",
    )
    add_routing_arguments(parser)  # the gateway's: --state-dir | --kubernetes, --config, logs
    return parser


async def serve(args: argparse.Namespace, config: GatewayConfig) -> None:
    from llmplane.epp.server import start_picker

    async with routing_sources(args) as (store, discovery, wake):
        try:
            picker = await start_picker(
                store,
                discovery,
                args.host,
                args.port,
                config,
                fallbacks=args.fallbacks,
                metrics_port=args.metrics_port,
                message_timeout=args.message_timeout,
                wake=wake,
            )
        except (OSError, RuntimeError) as e:  # grpc reports a busy port as RuntimeError
            raise listen_error(args, e, " (or --metrics-port)") from None
        line = f"LISTENING {picker.host}:{picker.port}"
        if picker.metrics_port is not None:
            line += f" metrics {picker.host}:{picker.metrics_port}"
        print(line, flush=True)
        try:
            await until_signalled()
        finally:
            await picker.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.fallbacks < 0:
            raise StartupError("--fallbacks must be 0 or more")
        if not args.message_timeout > 0:
            raise StartupError("--message-timeout must be above 0 seconds")
        try:
            import grpc  # noqa: F401
            import grpc_health  # noqa: F401
            from envoy.service.ext_proc.v3 import external_processor_pb2  # noqa: F401
        except ImportError as e:
            raise StartupError(
                f"needs the 'epp' extra ({e.name} is missing): pip install 'llmplane[epp]'"
            ) from None
        config = configure(args)
        from llmplane.epp.server import within_message_timeout

        capped = within_message_timeout(config, args.message_timeout)
        if capped is not config and config.flow_control_ttl != GatewayConfig.flow_control_ttl:
            # start_picker caps it; a TTL the user set is worth a line, the default is not
            print(
                f"llmplane epp: flowControlTtl {config.flow_control_ttl:g} s is longer than "
                f"Envoy's ext_proc message timeout (--message-timeout {args.message_timeout:g}); "
                f"a queued request waits at most {capped.flow_control_ttl:g} s",
                file=sys.stderr,
            )
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args, config))
    except (ConfigFileError, StartupError) as e:
        print(f"llmplane epp: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
