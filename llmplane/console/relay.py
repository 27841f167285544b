"""The console in a worker that is not the platform's (``llmplane up --workers N``): the
console's paths are answered by the platform process, which holds the runtime the console
reads. ``ConsoleRelay`` is a gateway extension with the console's routes; each request goes
over the workers' private socket (``Seat.ask``) to worker 0, whose ``answer`` serves it with
its own ``Console`` (the same authorisation, on the same headers) and sends the response
back. GET only, no request body, small answers: nothing here is on the inference path."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from llmplane.console.api import API, API_NAMES, static_files
from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.http_server import Handler, Headers, HttpRequest, HttpServer, Response

if TYPE_CHECKING:
    from llmplane.gateway.workers.share import Seat

PLATFORM = 0  # the worker that runs the console itself


def console_paths() -> list[str]:
    return [*static_files(), *(f"{API}/{name}" for name in API_NAMES)]


class ConsoleRelay:
    """The console's routes, answered by worker ``PLATFORM`` (an ``Extension``)."""

    def __init__(self, seat: Seat) -> None:
        self.seat = seat  # this worker's: asks worker ``PLATFORM``

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {("GET", path): self.relay for path in console_paths()}

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def relay(self, request: HttpRequest) -> Response:
        ask = {"method": request.method, "path": request.path, "path_qs": request.path_qs}
        ask["headers"] = dict(request.headers)
        answer = await self.seat.ask(PLATFORM, b"http", orjson.dumps(ask))
        if not answer:
            return GatewayError(
                503, "the console's process did not answer; retry", ErrorCode.CONSOLE_UNAVAILABLE
            ).response()
        head, _, body = answer.partition(b"\n")
        doc = orjson.loads(head)
        return Response(status=doc["status"], body=body, headers=doc["headers"])


async def answer(http: HttpServer | None, payload: bytes) -> bytes:
    """Worker ``PLATFORM``'s side: serve a relayed request with its own routes (console
    paths only) and frame the response (a JSON head line, then the body)."""
    ask = orjson.loads(payload)
    path = ask.get("path")
    if http is None or path not in console_paths():
        status, headers, body = 404, {}, b""
    else:
        request = HttpRequest(
            None,  # type: ignore[arg-type]  # no connection: handlers read the fields only
            "GET",
            path,
            str(ask.get("path_qs") or path),
            Headers({str(k).lower(): str(v) for k, v in (ask.get("headers") or {}).items()}),
            b"",
            "1.1",
            False,
            False,
        )
        response = await http.dispatch(request)
        if not isinstance(response, Response):
            status, headers, body = 502, {}, b""
        else:
            status, headers, body = response.status, dict(response.headers or {}), response.body
    return orjson.dumps({"status": status, "headers": headers}) + b"\n" + body
