"""Who is calling: API keys of Tenants, checked on every inference request and admin path.

The tenant table (``TenantTable``) is built from the store's Tenant objects whenever they
change, like the routing table, and swapped in whole: a request looks its key up by the
key's public id (one dict lookup) and checks one HMAC-SHA256 in constant time
(``apikeys.matches``). Keys come as ``Authorization: Bearer <key>`` (what the ``openai``
client sends) or ``x-api-key: <key>``.

Answers, OpenAI-style: 401 ``invalid_api_key`` for a missing, unknown, malformed or revoked
key (one message for all, so a caller learns nothing about which); 403 ``model_not_allowed``
for a model outside the tenant's list, the same answer whether the model exists or not.

Authentication is on when at least one Tenant exists, or when the gateway listens beyond
loopback (then, without Tenants, every inference request is refused: an open gateway on a
network is never the silent default). The admin key (``gateway.adminKeyHash``) guards
``/metrics`` and the console's JSON API.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from llmplane.gateway import apikeys
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.observability import Counter

log = logging.getLogger("llmplane.gateway")

KIND = "Tenant"
INVALID_KEY = "Incorrect or missing API key. Pass one as 'Authorization: Bearer <key>'."


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str  # namespace/name outside "default", else name
    models: tuple[str, ...]
    criticality: str

    def allows(self, model: str) -> bool:
        return any(p == model or fnmatchcase(model, p) for p in self.models)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    tenant: Tenant
    salt: str
    hash: str


class TenantTable:
    """Immutable: the live keys of every Tenant by key id."""

    __slots__ = ("keys", "names", "tenants")

    def __init__(self, objects: Iterable[Mapping[str, Any]] = ()) -> None:
        keys: dict[str, KeyRecord] = {}
        tenants = 0
        names: list[str] = []
        for obj in objects:
            if obj.get("kind") != KIND:
                continue
            tenants += 1
            meta = obj["metadata"]
            ns = meta.get("namespace") or "default"
            name = meta["name"] if ns == "default" else f"{ns}/{meta['name']}"
            names.append(name)
            spec = obj.get("spec") or {}
            tenant = Tenant(
                name, tuple(spec.get("models") or ("*",)), spec.get("criticality") or "Default"
            )
            for key in spec.get("keys") or ():
                if key.get("revoked"):
                    continue
                if key["id"] in keys:  # two tenants claim one id: neither key is trusted
                    log.warning("API key id %s appears in two Tenants; both refused", key["id"])
                    keys[key["id"]] = KeyRecord(tenant, "", "")
                    continue
                keys[key["id"]] = KeyRecord(tenant, key["salt"], key["hash"])
        self.keys = keys
        self.tenants = tenants
        self.names = frozenset(names)


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key from ``Authorization: Bearer`` or ``x-api-key`` (lower-case header names)."""
    auth = dict.get(headers, "authorization")  # type: ignore[arg-type]
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer":
            return value.strip() or None
    key = dict.get(headers, "x-api-key")  # type: ignore[arg-type]
    return key.strip() if key else None


def lookup(keys: Mapping[str, KeyRecord], key: str | None) -> KeyRecord | None:
    if key is None:
        return None
    key_id = apikeys.key_id(key)
    record = keys.get(key_id) if key_id is not None else None
    if record is None or not record.hash or not apikeys.matches(key, record.salt, record.hash):
        return None
    return record


class Authenticator:
    """The gateway's key check; ``table`` is swapped by ``update``."""

    def __init__(self, admin_key_hash: str | None = None) -> None:
        self.table = TenantTable()
        # Label values are tenant names from the table only (never anything a client sent).
        self.requests = Counter(
            "llmplane_gateway_tenant_requests",
            "Requests by tenant and status",
            ("tenant", "status"),
        )
        self.loopback = True  # set from the listening host at start
        self.admin: tuple[str, str, str] | None = None
        if admin_key_hash:
            self.admin = apikeys.parse_admin_setting(admin_key_hash)

    def update(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self.table = TenantTable(objects)

    @property
    def enabled(self) -> bool:
        return self.table.tenants > 0 or not self.loopback

    def authenticate(self, headers: Mapping[str, str]) -> Tenant | None:
        """The calling tenant (None while authentication is off); 401 without a live key."""
        if self.table.tenants == 0 and self.loopback:
            return None
        return self.caller(headers)

    @staticmethod
    def permit(tenant: Tenant, model: str) -> None:
        """403 unless ``tenant`` may use ``model``: the same answer whether the model exists
        or not, so a key learns nothing about models beyond its own."""
        if not tenant.allows(model):
            raise GatewayError(
                403,
                f"The model {model!r} does not exist or this key may not use it.",
                "model_not_allowed",
                param="model",
            )

    def caller(self, headers: Mapping[str, str]) -> Tenant:
        """The tenant whose live key was presented; 401 without one."""
        record = lookup(self.table.keys, presented_key(headers))
        if record is None:
            raise GatewayError(401, INVALID_KEY, "invalid_api_key")
        return record.tenant

    def admin_refusal(self, headers: Mapping[str, str]) -> str | None:
        """None when the admin key is not configured or was presented; else why not."""
        if self.admin is None:
            return None
        key = presented_key(headers)
        key_id, salt, digest = self.admin
        if key is None or apikeys.key_id(key) != key_id or not apikeys.matches(key, salt, digest):
            return "this path needs the admin key (Authorization: Bearer <key>)"
        return None
