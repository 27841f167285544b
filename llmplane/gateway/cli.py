"""``llmplane gateway`` (also ``python -m llmplane.gateway.cli``): the gateway on its own.

Routes come from the state directory's store (``--state-dir``), or in-cluster from the
Kubernetes API (``--kubernetes``: Pods and routing objects). Prints ``LISTENING host:port``
once it serves; SIGINT / SIGTERM close it gracefully. A problem the user can fix (a bad
``--config``, a busy port, no usable Kubernetes API) is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from llmplane.aio import run, wait_event
from llmplane.console.api import Console
from llmplane.fdlimit import raise_open_files
from llmplane.gateway.config import ConfigFileError, GatewayConfig, load_checked
from llmplane.gateway.discovery import Discovery
from llmplane.gateway.discovery.store_endpoints import StoreEndpoints
from llmplane.gateway.observability import flush_access_log, install_access_sink
from llmplane.gateway.server import start_gateway
from llmplane.gcpolicy import freeze_survivors
from llmplane.store.base import Store
from llmplane.store.paths import open_store

if TYPE_CHECKING:
    from llmplane.gateway.workers.share import Seat

MAX_WORKERS = 64


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmplane gateway",
        description="Serve the OpenAI API and route to the endpoints registered in the store.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--workers",
        type=_workers,
        default="auto",  # one per usable core, at most 8: llmplane/gateway/workers/cores.py
        help="worker processes serving the port, sharing one routing state: a number, or "
        "auto (default) for one per core this process may use (its CPU affinity and cgroup "
        "quota), at most 8; see docs/gateway.md, Workers",
    )
    add_routing_arguments(parser)
    return parser


# --- shared with ``llmplane epp`` (llmplane/epp/cli.py): same sources, config and logging ---


def add_routing_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the routing state comes from (state directory or Kubernetes), the scheduler
    config and logging."""
    parser.add_argument(
        "--state-dir", default=None, help="state directory (default $LLMPLANE_HOME or ~/.llmplane)"
    )
    parser.add_argument(
        "--config", default=None, help="scheduler.yaml (EndpointPickerConfig + gateway: settings)"
    )
    parser.add_argument(
        "--flow-control",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="queue requests in the gateway by priority and tenant while every endpoint is "
        "saturated (default: on, or gateway.flowControl in --config)",
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
    kube.add_argument(
        "--key-secrets",
        action="store_true",
        help="with --kubernetes: also read Tenant keys' salt and hash from the Secrets their "
        "keys[].secretRef names (only Secrets labelled llmplane.io/api-key; needs get/list/"
        "watch on secrets, the chart's gateway.keySecrets)",
    )
    kube.add_argument("--kube-server", help=argparse.SUPPRESS)  # API server URL (development)


class StartupError(Exception):
    """The gateway cannot start for a reason the user can fix (said in one line)."""


@contextlib.asynccontextmanager
async def routing_sources(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[Store, Discovery, Callable[[str], None] | None]]:
    """The store and endpoint discovery ``add_routing_arguments`` chose, and in a cluster the
    activator's ``wake`` (it asks the API for a Playground's first replica); on exit all are
    closed and the access log flushed."""
    scaler = None
    if args.kubernetes:
        # Imported here: kubernetes_asyncio is an optional extra.
        from llmplane.gateway.discovery.pods import kubernetes_sources, parse_namespaces
        from llmplane.gateway.kube_activation import KubeScaleFromZero

        try:
            store, discovery = await kubernetes_sources(
                parse_namespaces(args.namespace), args.kube_server, key_secrets=args.key_secrets
            )
        except Exception as e:  # kubernetes_asyncio's config and connection errors
            raise StartupError(
                "--kubernetes: no usable Kubernetes API (in-cluster config, else kubeconfig): "
                f"{type(e).__name__}: {e}"
            ) from None
        scaler = KubeScaleFromZero(store.api, store)
    else:
        store = open_store(args.state_dir)
        discovery = StoreEndpoints(store)
    try:
        yield store, discovery, scaler.wake if scaler is not None else None
    finally:
        if scaler is not None:
            await scaler.close()
            await store.aclose()  # the Kubernetes store closes its API client
        else:
            store.close()
        flush_access_log()


def listen_error(args: argparse.Namespace, e: Exception, also: str = "") -> StartupError:
    reason = getattr(e, "strerror", None) or str(e)
    return StartupError(
        f"cannot listen on {args.host}:{args.port}{also}: {reason} "
        "(pass --port N, or --port 0 for any free port)"
    )


async def until_signalled(orphan_of: int | None = None) -> None:
    """Return on SIGINT or SIGTERM (or, given the supervisor's pid ``orphan_of``, once that
    process is gone: a worker never outlives its supervisor)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    while not await wait_event(stop, None if orphan_of is None else 1.0):
        if os.getppid() != orphan_of:
            return


def configure(args: argparse.Namespace) -> GatewayConfig:
    """``--config`` loaded and checked (``ConfigFileError`` says what is wrong), logging set
    up: warnings and up on stderr, the JSON access log on stdout unless ``--no-access-log``."""
    config = load_checked(args.config) if args.config is not None else GatewayConfig()
    if args.flow_control is not None:
        config.flow_control = args.flow_control
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    access = logging.getLogger("llmplane.gateway.access")
    access.propagate = False
    if args.no_access_log:
        access.setLevel(logging.WARNING)
    else:
        sys.stdout.flush()
        install_access_sink(sys.stdout.fileno())
        access.setLevel(logging.INFO)
    return config


def _workers(text: str) -> int:
    if text.strip().lower() == "auto":
        from llmplane.gateway.workers.cores import auto_workers

        return auto_workers()
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or auto: {text!r}") from None
    if not 1 <= n <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{n} is not between 1 and {MAX_WORKERS}")
    return n


async def serve(
    args: argparse.Namespace,
    config: GatewayConfig,
    seat: Seat | None = None,
    ready: Callable[[], None] | None = None,
) -> None:
    """One gateway: alone (prints LISTENING), or worker ``seat`` of a supervisor (calls
    ``ready`` once it serves, stops with its supervisor)."""
    async with routing_sources(args) as (store, discovery, wake):
        try:
            gateway = await start_gateway(
                store,
                discovery,
                args.host,
                args.port,
                config,
                extensions=[Console],
                seat=seat,
                wake=wake,
            )
        except OSError as e:
            raise listen_error(args, e) from None
        if ready is None:
            print(f"LISTENING {gateway.host}:{gateway.port}", flush=True)
        else:
            ready()
        collector = asyncio.create_task(freeze_survivors(), name="gc")  # llmplane/gcpolicy.py
        try:
            await until_signalled(os.getppid() if seat is not None else None)
        finally:
            collector.cancel()
            await gateway.close()


def supervise(args: argparse.Namespace, config: GatewayConfig) -> int:
    """``--workers N`` > 1: bind the workers' sockets here, fork the workers onto them."""
    from llmplane.gateway.workers.share import Share, listen
    from llmplane.gateway.workers.supervisor import Supervisor

    try:
        socks = listen(args.host, args.port, args.workers)
    except OSError as e:
        raise listen_error(args, e) from None
    host, port = socks[0].getsockname()[:2]

    def worker(seat: Seat, ready: Callable[[], None]) -> int:
        try:
            run(serve(args, config, seat, ready))
        except StartupError as e:
            print(f"llmplane gateway: {e}", file=sys.stderr)
            return 2
        return 0

    def serving() -> None:
        print(f"LISTENING {host}:{port}", flush=True)

    share = Share(args.workers, socks)
    try:
        return Supervisor(share, worker, config.shutdown_grace).run(serving)
    finally:
        share.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = configure(args)
        raise_open_files()  # before any fork: the workers inherit it (llmplane/fdlimit.py)
        if args.workers > 1:
            return supervise(args, config)
        run(serve(args, config))
    except (ConfigFileError, StartupError) as e:
        print(f"llmplane gateway: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
