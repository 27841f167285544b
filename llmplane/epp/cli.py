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
import logging
import signal
import sys
from collections.abc import Sequence

from llmplane.gateway.config import ConfigFileError, GatewayConfig, load_checked

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
        "--metrics-port", type=int, default=None, help="serve /metrics and /health on this port"
    )
    parser.add_argument(
        "--fallbacks",
        type=int,
        default=0,
        help="endpoints to name after the chosen one (comma-separated) for data planes that "
        "retry down the list; an ORIGINAL_DST cluster follows one address: keep 0 there",
    )
    parser.add_argument(
        "--state-dir", default=None, help="state directory (default $LLMPLANE_HOME or ~/.llmplane)"
    )
    parser.add_argument(
        "--config", default=None, help="scheduler.yaml (EndpointPickerConfig + gateway: settings)"
    )
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--no-access-log", action="store_true", help="do not print one JSON line per request"
    )
    kube = parser.add_argument_group("Kubernetes (in-cluster)")
    kube.add_argument(
        "--kubernetes",
        action="store_true",
        help="read routes from the Kubernetes API and route to ready Pods (in-cluster config, "
        "else kubeconfig) instead of the state directory",
    )
    kube.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="with --kubernetes: namespace to read (repeatable; default 'all')",
    )
    kube.add_argument("--kube-server", help=argparse.SUPPRESS)  # API server URL (development)
    return parser


class StartupError(Exception):
    """The picker cannot start for a reason the user can fix (said in one line)."""


async def serve(args: argparse.Namespace, config: GatewayConfig) -> None:
    from llmplane.epp.server import start_picker
    from llmplane.gateway.discovery.store_endpoints import StoreEndpoints
    from llmplane.store.paths import open_store

    if args.kubernetes:
        from llmplane.gateway.discovery.pods import kubernetes_sources, parse_namespaces

        try:
            store, discovery = await kubernetes_sources(
                parse_namespaces(args.namespace), args.kube_server
            )
        except Exception as e:  # kubernetes_asyncio's config and connection errors
            raise StartupError(
                "--kubernetes: no usable Kubernetes API (in-cluster config, else kubeconfig): "
                f"{type(e).__name__}: {e}"
            ) from None
    else:
        store = open_store(args.state_dir)
        discovery = StoreEndpoints(store)

    async def close_store() -> None:
        aclose = getattr(store, "aclose", None)  # the Kubernetes store closes its API client
        await aclose() if aclose is not None else store.close()

    try:
        picker = await start_picker(
            store,
            discovery,
            args.host,
            args.port,
            config,
            fallbacks=args.fallbacks,
            metrics_port=args.metrics_port,
        )
    except (OSError, RuntimeError) as e:  # grpc reports a busy port as RuntimeError
        await close_store()
        raise StartupError(
            f"cannot listen on {args.host}:{args.port} (or --metrics-port): "
            f"{getattr(e, 'strerror', None) or e} (pass --port N, or --port 0 for any free port)"
        ) from None
    line = f"LISTENING {picker.host}:{picker.port}"
    if picker.metrics_port is not None:
        line += f" metrics {picker.host}:{picker.metrics_port}"
    print(line, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await picker.close()
        await close_store()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.fallbacks < 0:
        print("llmplane epp: --fallbacks must be 0 or more", file=sys.stderr)
        return 2
    try:
        import grpc  # noqa: F401
        import grpc_health  # noqa: F401
        from envoy.service.ext_proc.v3 import external_processor_pb2  # noqa: F401
    except ImportError as e:
        print(
            f"llmplane epp: needs the 'epp' extra ({e.name} is missing): "
            "pip install 'llmplane[epp]'",
            file=sys.stderr,
        )
        return 2
    config = GatewayConfig()
    if args.config is not None:
        try:
            config = load_checked(args.config)
        except ConfigFileError as e:
            print(f"llmplane epp: {e}", file=sys.stderr)
            return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    access = logging.getLogger("llmplane.gateway.access")
    access.propagate = False
    if args.no_access_log:
        access.setLevel(logging.WARNING)
    else:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        access.addHandler(handler)
        access.setLevel(logging.INFO)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args, config))
    except StartupError as e:
        print(f"llmplane epp: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
