"""The console's HTTP side: its static files and the JSON it reads, as gateway routes.

``Console(gateway, runtime)`` is a gateway extension (``routes()``, ``start()``, ``close()``):
the gateway adds these exact-path routes to its table at start, so the inference paths are not
touched and cost nothing more. Everything here is read-only; chat goes to the gateway's own
``/v1/chat/completions`` from the browser.

``GET /console/`` (and the files beside it), and under ``/console/api/``:

- ``models``: every name the gateway routes, with what makes it routable;
- ``fleet``: workloads, replicas and live endpoint load (``fleet.snapshot``), and the
  streams moved to another replica (``Migrator.summary``);
- ``stats?since=T``: per-second request points for the charts (``stats.RequestStats``);
- ``resources``: every stored object of every kind, as YAML (credentials masked);
- ``logs?workload=NS/NAME&replica=I``: the tail of a replica's log (``llmplane up`` only);
- ``whoami``: what the presented key may do (``admin``: read the console API; ``chat``: call
  ``/v1``; ``adminKey``: whether an admin key is configured), always 200, so the page learns
  it needs a key without a 401 (which the browser logs as a failed resource).

Access: ``authorize(request)`` returns None to allow or a reason to refuse (401). By default
(``key_refusal``): the admin key when one is configured, or once the gateway asks inference
requests for a key (a Tenant exists, or it listens beyond loopback; without an admin key
configured, nobody then reads it); else nothing, as the rest of a loopback gateway. The static
files carry no data and stay public.
Whatever is shown has its credentials masked (``redact.py``): resources, fleet messages, logs.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlsplit

import orjson

from llmplane.console.fleet import snapshot
from llmplane.console.redact import redact, redact_text
from llmplane.console.stats import RequestStats, peer_totals, report_totals
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.http_server import Handler, Headers, HttpRequest, Response
from llmplane.gateway.routing import RoutingTable
from llmplane.printing import to_yaml

if TYPE_CHECKING:
    from llmplane.gateway.auth import Authenticator
    from llmplane.gateway.observability import GatewayMetrics
    from llmplane.gateway.server import GatewayView
    from llmplane.gateway.workers.share import Seat
    from llmplane.store.base import Store

PREFIX = "/console"
API = f"{PREFIX}/api"
LOG_TAIL_BYTES = 64 * 1024
API_NAMES = ("models", "fleet", "stats", "resources", "logs", "whoami")  # under API/
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# ASCII digits only: str.isdigit also takes other scripts' digits and superscripts, and int()
# refuses 5,000 digits (fullmatch: "$" would let a trailing newline through).
_INDEX = re.compile(r"[0-9]{1,6}")
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
# Same-origin only: no inline script, nothing fetched from anywhere else.
_SECURITY = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

Authorize = Callable[[HttpRequest], str | None]


class ConsoleGateway(Protocol):
    """What the console reads of the gateway it extends (``llmplane.gateway.server.Gateway``)."""

    auth: Authenticator  # who may read the console, who may chat
    seat: Seat | None  # --workers N: every worker's request counts
    metrics: GatewayMetrics  # the request counters the charts sample
    store: Store | None  # the resources page
    table: RoutingTable  # the models page

    def view(self) -> GatewayView: ...  # the endpoints' load, for the fleet page

    def migrations(self) -> list[dict[str, Any]]: ...  # streams moved to another replica


def _json(data: Any, status: int = 200) -> Response:
    return Response(
        status=status,
        body=orjson.dumps(data),
        headers={"Content-Type": "application/json", "Cache-Control": "no-store"},
    )


def _error(status: int, message: str) -> Response:
    return _json({"error": {"message": message}}, status)


def _query(request: HttpRequest) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlsplit(request.path_qs).query).items()}


def static_files() -> dict[str, tuple[bytes, str]]:
    """path -> (body, content type) for every file shipped in ``llmplane/console/static``."""
    folder = resources.files("llmplane.console") / "static"
    files = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            files[f"{PREFIX}/{entry.name}"] = (entry.read_bytes(), _TYPES[suffix])
    index = files.get(f"{PREFIX}/index.html")
    if index is not None:
        files[PREFIX] = files[f"{PREFIX}/"] = index
    return files


def route_sources(table: RoutingTable) -> list[dict[str, str]]:
    """Every model name the routing table answers, with what makes it routable."""
    out = []
    for name in table.model_names():
        if name in table.routes_by_model:
            via = "ModelRoute"
        elif name in table.routes_by_lora:
            via = "LoRA adapter"
        elif name in table.inference_models:
            via = "InferenceModel"
        elif name in table.rewrites:
            via = "InferenceModelRewrite"
        elif name in table.decisions and table.decisions[name].load is None:
            via = "served model"  # (a declared adapter no replica holds yet: no ready endpoint)
        else:
            via = "no ready endpoint"
        out.append({"name": name, "via": via})
    return out


def key_refusal(auth: Authenticator, headers: Headers) -> str | None:
    """Why the console's API refuses a request (None: it may read): the admin key once one is
    configured, and once inference needs a key (a Tenant exists, or the gateway listens beyond
    loopback) whether or not one is. A tenant's key never reads it: tenants call models, the
    console shows every tenant's models, replicas and logs."""
    if auth.admin is not None:
        return auth.admin_refusal(headers)
    if not auth.enabled:
        return None
    return (
        "the console's API needs the admin key once a Tenant exists, and none is configured: "
        "run `llmplane keys admin` and start with the setting it prints (--gateway-config)"
    )


class Console:
    """The console as a gateway extension."""

    def __init__(
        self, gateway: ConsoleGateway, runtime: Any = None, authorize: Authorize | None = None
    ) -> None:
        self.gateway = gateway
        self.runtime = runtime
        auth = gateway.auth
        self.authorize: Authorize = authorize or (
            lambda request: key_refusal(auth, request.headers)
        )
        seat = gateway.seat  # --workers N: count every worker's requests
        several = seat is not None and seat.workers > 1
        self.stats = RequestStats(
            gateway.metrics,
            endpoints=lambda: gateway.view().endpoints,
            peers=peer_totals(seat) if several else None,
            publish=report_totals(seat) if several else None,
        )
        self.files = static_files()

    # --- the extension interface --------------------------------------------------------------

    def routes(self) -> dict[tuple[str, str], Handler]:
        table: dict[tuple[str, str], Handler] = {("GET", p): self._static for p in self.files}
        handlers = {
            "models": self.models,
            "fleet": self.fleet,
            "stats": self.series,
            "resources": self.resources,
            "logs": self.logs,
            "whoami": self.whoami,
        }
        assert tuple(handlers) == API_NAMES
        table.update({("GET", f"{API}/{name}"): h for name, h in handlers.items()})
        return table

    async def start(self) -> None:
        self.stats.start()

    async def close(self) -> None:
        await self.stats.close()

    # --- handlers ---------------------------------------------------------------------------------

    async def _static(self, request: HttpRequest) -> Response:
        body, content_type = self.files[request.path]
        return Response(body=body, headers={**_SECURITY, "Content-Type": content_type})

    def _refused(self, request: HttpRequest) -> Response | None:
        reason = self.authorize(request)
        return None if reason is None else _error(401, reason)

    async def whoami(self, request: HttpRequest) -> Response:
        """What the presented key (or none) may do here; never 401 (the page asks first)."""
        admin = self.authorize(request) is None
        auth = self.gateway.auth
        chat, tenant = True, None
        try:
            caller = auth.authenticate(request.headers)
        except GatewayError:
            chat = False
        else:
            tenant = caller.name if caller is not None else None
        admin_key = auth.admin is not None
        return _json({"admin": admin, "chat": chat, "tenant": tenant, "adminKey": admin_key})

    async def models(self, request: HttpRequest) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        return _json({"models": route_sources(self.gateway.table)})

    async def fleet(self, request: HttpRequest) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        view = self.gateway.view()
        data = snapshot(self.gateway.store, self.runtime, view, self.stats.prefix_hit_rate)
        data["embedded"] = self.runtime is not None
        data["migrations"] = self.gateway.migrations()  # this gateway process's
        return _json(redact(data))

    async def series(self, request: HttpRequest) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        since = _query(request).get("since")
        try:
            after = float(since) if since else None
        except ValueError:
            return _error(400, f"since: not a number: {since!r}")
        return _json({"points": self.stats.series(after)})

    async def resources(self, request: HttpRequest) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        from llmplane.api.registry import KINDS

        store = self.gateway.store
        kinds = []
        for kind in KINDS:
            items = [
                {
                    "namespace": obj["metadata"].get("namespace"),
                    "name": obj["metadata"]["name"],
                    "yaml": to_yaml(redact(obj)),
                }
                for obj in (store.list(kind) if store is not None else [])
            ]
            kinds.append({"kind": kind, "items": items})
        return _json({"kinds": kinds})

    async def logs(self, request: HttpRequest) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if self.runtime is None:
            return _error(404, "replica logs are kept by llmplane up; this gateway has none")
        q = _query(request)
        namespace, _, name = q.get("workload", "").partition("/")
        replica = q.get("replica", "0")
        if not (_NAME.match(namespace) and _NAME.match(name) and _INDEX.fullmatch(replica)):
            return _error(400, "give workload=NAMESPACE/NAME and replica=INDEX (0-999999)")
        key = f"{namespace}/{name}"
        if self.runtime.status(key) is None:
            return _error(404, f"no workload {key} is running here")
        path = self.runtime.log_path(key, int(replica))
        try:
            text = await asyncio.to_thread(_tail, path, LOG_TAIL_BYTES)
        except FileNotFoundError:
            text, note = "", f"replica {replica} of {key} has no log yet"
        except OSError as err:  # unreadable: say so, as the page shows a missing log
            text, note = "", f"the log of replica {replica} of {key} cannot be read: {err.strerror}"
        else:
            note = ""
        text = redact_text(text)
        return _json({"workload": key, "replica": int(replica), "text": text, "note": note})


def _tail(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - limit))
        data = f.read()
    if size > limit:
        data = data.partition(b"\n")[2]  # drop the cut line
    return data.decode("utf-8", "replace")
