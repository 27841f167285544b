"""Who may talk to the gateway from a browser: Origin, Host and Content-Type checks on every
request (the rules, and why: docs/security.md, "Browsers: Origin, Host and Content-Type").

A gateway on loopback is still reachable from any web page the same machine's browser opens
(a "simple" POST needs no CORS preflight, and a DNS-rebinding page may read the answers), so a
page on another origin is refused (``cross_site``), a Host that is not the gateway's is
refused, and a POST must carry a JSON body type. Clients outside browsers send neither
``Origin`` nor ``Sec-Fetch-Site`` and pass.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable

from llmplane.gateway.clip import shown
from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.http_server import HttpRequest, Response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain"})

_ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[^/?#@\s:\[\]]+)(:[0-9]{1,5})?$")

Guard = Callable[[HttpRequest], Response | None]


def is_loopback(host: str) -> bool:
    """Whether a listen address only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The name in a Host header, lower case, without port or trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6]:port
        return value[1 : value.find("]")] if "]" in value else value
    name = value.rpartition(":")[0] if value.count(":") == 1 else value
    return name.rstrip(".")


def origin_name(value: str) -> str:
    """An origin as a browser writes it: ``scheme://host[:port]`` in lower case."""
    return value.strip().lower().rstrip("/")


def check_origins(values: Iterable[str]) -> None:
    """ValueError unless each of ``values`` is ``*``, ``null`` or ``scheme://host[:port]``."""
    for value in values:
        if not isinstance(value, str) or not (
            value in ("*", "null") or _ORIGIN.match(origin_name(value))
        ):
            raise ValueError(
                f"gateway.allowedOrigins: {value!r} is not an origin: write "
                "scheme://host[:port] (no path), null or *"
            )


def cross_site(request: HttpRequest, allowed: frozenset[str]) -> str | None:
    """What makes ``request`` one a page on another origin sent (None: nothing does)."""
    headers = request.headers
    origin = dict.get(headers, "origin")
    if origin is not None:
        name = origin.strip().lower()
        if name in allowed:
            return None
        _, sep, authority = name.partition("://")
        host = dict.get(headers, "host")
        if sep and host is not None and authority == host.strip().lower():
            return None  # the gateway's own page
        return f"Origin {shown(origin)}"
    site = dict.get(headers, "sec-fetch-site")
    if site is not None and site.lower() in ("cross-site", "same-site"):
        if (
            request.method in ("GET", "HEAD")
            and dict.get(headers, "sec-fetch-mode") == "navigate"
            and dict.get(headers, "sec-fetch-dest") == "document"
        ):
            return None  # a link followed to a page: nothing the other site can read
        return f"Sec-Fetch-Site {shown(site)}"
    return None


def make_guard(
    listen_host: str, allowed_hosts: Iterable[str], allowed_origins: Iterable[str] = ()
) -> Guard:
    """The check ``HttpServer`` runs before routing each request (None: let it through)."""
    origins = frozenset(origin_name(o) for o in allowed_origins)
    any_origin = "*" in origins
    allowed = {host_name(h) for h in allowed_hosts}
    any_host = "*" in allowed
    if is_loopback(listen_host):
        allowed |= LOOPBACK_NAMES
    check_host = bool(allowed) and not any_host

    def guard(request: HttpRequest) -> Response | None:
        headers = request.headers
        if not any_origin and (foreign := cross_site(request, origins)) is not None:
            return GatewayError(
                403,
                f"{foreign}: requests from web pages on other origins are refused (add the "
                "page's origin to gateway.allowedOrigins)",
                ErrorCode.ORIGIN_NOT_ALLOWED,
            ).response()
        host = dict.get(headers, "host")
        if check_host and host is not None and host_name(host) not in allowed:
            return GatewayError(
                403,
                f"Host {shown(host)} is not allowed: the gateway answers requests for "
                f"{', '.join(sorted(allowed))} (add a name to gateway.allowedHosts)",
                ErrorCode.HOST_NOT_ALLOWED,
            ).response()
        kind = dict.get(headers, "content-type")
        if request.method == "POST" and kind is not None:
            media = kind.partition(";")[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                return GatewayError(
                    415,
                    f"Content-Type {shown(kind)} is not supported: send application/json",
                    ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                ).response()
        return None

    return guard
