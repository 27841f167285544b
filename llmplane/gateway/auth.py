"""Who is calling: API keys of Tenants, checked on every inference request and admin path
(the answers and when authentication is on: docs/security.md, "Authentication").

The tenant table is rebuilt from the store's Tenant objects whenever they change and swapped in
whole, so a request costs one dict lookup by the key's public id and one HMAC-SHA256 from a
state keyed once per key (``apikeys.matches``). One 401 message for every bad key, and one 403
whether a model exists or not, so a caller learns nothing about keys or models beyond its own.
"""

from __future__ import annotations

import base64
import fnmatch
import hmac
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmplane.api.llmplane import API_KEY_SECRET_LABEL
from llmplane.gateway import apikeys
from llmplane.gateway.clip import shown
from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.observability import Counter

log = logging.getLogger("llmplane.gateway")

KIND = "Tenant"
SECRET_KIND = "Secret"
_GLOB = re.compile(r"[*?\[]")
INVALID_KEY = "Incorrect or missing API key. Pass one as 'Authorization: Bearer <key>'."


class TenantAccess:
    """One Tenant as the gateway uses it."""

    __slots__ = ("_exact", "_pattern", "criticality", "models", "name", "weight")

    def __init__(
        self, name: str, models: tuple[str, ...], criticality: str, weight: int = 1
    ) -> None:
        self.name = name  # namespace/name outside "default", else name
        self.models = models
        self.criticality = criticality
        self.weight = weight  # share of flow-control dispatches (gateway/flowcontrol/)
        self._exact = frozenset(m for m in models if not _GLOB.search(m))
        globs = [fnmatch.translate(m) for m in models if _GLOB.search(m)]
        self._pattern = re.compile("|".join(globs)) if globs else None

    def allows(self, model: str) -> bool:
        pattern = self._pattern
        return model in self._exact or (pattern is not None and pattern.match(model) is not None)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    tenant: TenantAccess
    hash: bytes
    mac: hmac.HMAC  # keyed by the key's salt (apikeys.keyed), copied per check


class TenantTable:
    """Immutable: the live keys of every Tenant by key id. A key with ``secretRef`` takes its
    salt and hash from that Secret among ``objects`` (the Kubernetes store follows Secrets
    labelled ``llmplane.io/api-key``); without it the key is refused."""

    __slots__ = ("keys", "tenants")

    def __init__(self, objects: Iterable[Mapping[str, Any]] = ()) -> None:
        keys: dict[str, KeyRecord | None] = {}  # None: refused
        tenants = 0
        objects = list(objects)
        secrets = {
            (obj["metadata"].get("namespace") or "default", obj["metadata"]["name"]): obj
            for obj in objects
            if obj.get("kind") == SECRET_KIND
        }
        for obj in objects:
            if obj.get("kind") != KIND:
                continue
            tenants += 1
            meta = obj["metadata"]
            ns = meta.get("namespace") or "default"
            name = meta["name"] if ns == "default" else f"{ns}/{meta['name']}"
            spec = obj.get("spec") or {}
            models = spec.get("models", ("*",)) or ()  # an empty list allows nothing
            tenant = TenantAccess(
                name, tuple(models), spec.get("criticality") or "Default", _weight(spec)
            )
            for key in spec.get("keys") or ():
                if not isinstance(key, Mapping) or key.get("revoked"):
                    continue
                record = _record(tenant, ns, key, secrets)
                if record is None:
                    continue
                key_id = key["id"]
                if key_id in keys:  # two tenants claim one id: neither key is trusted
                    log.warning("API key id %s appears in two Tenants; both refused", key_id)
                    record = None
                keys[key_id] = record
        self.keys = keys
        self.tenants = tenants


def _weight(spec: Mapping[str, Any]) -> int:
    weight = spec.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1000:
        return 1  # a hand-written object, unvalidated
    return weight


def _record(
    tenant: TenantAccess,
    namespace: str,
    key: Mapping[str, Any],
    secrets: Mapping[tuple[str, str], Mapping[str, Any]],
) -> KeyRecord | None:
    """The key's record, or None (logged) when its id, salt or hash is unusable."""
    salt, digest = key.get("salt"), key.get("hash")
    ref = key.get("secretRef")
    try:
        if isinstance(ref, Mapping):
            secret = secrets.get((namespace, str(ref.get("name"))))
            if secret is None:
                log.warning(
                    "Tenant %s: key %s names Secret %s/%s, which does not exist or lacks the "
                    "label %s; the key is refused until it does",
                    tenant.name,
                    key.get("id"),
                    namespace,
                    ref.get("name"),
                    API_KEY_SECRET_LABEL,
                )
                return None
            salt, digest = secret_value(secret, "salt"), secret_value(secret, "hash")
        if not isinstance(key["id"], str):
            raise TypeError("id")
        raw_salt = bytes.fromhex(salt)  # type: ignore[arg-type]
        raw_hash = bytes.fromhex(digest)  # type: ignore[arg-type]
        return KeyRecord(tenant, raw_hash, apikeys.keyed(raw_salt))
    except (KeyError, TypeError, ValueError):  # a hand-written object (or Secret), unvalidated
        log.warning("Tenant %s: a key without a valid id, salt and hash; ignored", tenant.name)
        return None


def secret_value(secret: Mapping[str, Any], field: str) -> str:
    """A Secret's ``field`` as text: ``stringData`` as written, ``data`` base64 (as the API
    server keeps it); KeyError when absent, ValueError when not base64."""
    plain = (secret.get("stringData") or {}).get(field)
    if isinstance(plain, str):
        return plain.strip()
    encoded = (secret.get("data") or {})[field]
    return base64.b64decode(encoded, validate=True).decode("ascii").strip()


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key from ``Authorization: Bearer`` or ``x-api-key`` (lower-case header names)."""
    auth = dict.get(headers, "authorization")  # type: ignore[arg-type]
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer":
            return value.strip() or None
    key = dict.get(headers, "x-api-key")  # type: ignore[arg-type]
    return key.strip() if key else None


def lookup(keys: Mapping[str, KeyRecord | None], key: str | None) -> KeyRecord | None:
    if key is None:
        return None
    key_id = apikeys.key_id(key)
    record = keys.get(key_id) if key_id is not None else None
    if record is None or not apikeys.matches(key, record.mac, record.hash):
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
        self.admin: tuple[str, hmac.HMAC, bytes] | None = None
        if admin_key_hash:
            key_id, salt, digest = apikeys.parse_admin_setting(admin_key_hash)
            self.admin = (key_id, apikeys.keyed(bytes.fromhex(salt)), bytes.fromhex(digest))

    def update(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self.table = TenantTable(objects)

    @property
    def enabled(self) -> bool:
        return self.table.tenants > 0 or not self.loopback

    def authenticate(self, headers: Mapping[str, str]) -> TenantAccess | None:
        """The calling tenant (None while authentication is off); 401 without a live key."""
        if self.table.tenants == 0 and self.loopback:
            return None
        return self.caller(headers)

    @staticmethod
    def permit(tenant: TenantAccess, model: str) -> None:
        """403 unless ``tenant`` may use ``model``: the same answer whether the model exists
        or not, so a key learns nothing about models beyond its own."""
        if not tenant.allows(model):
            raise GatewayError(
                403,
                f"The model {shown(model)} does not exist or this key may not use it.",
                ErrorCode.MODEL_NOT_ALLOWED,
                param="model",
            )

    def caller(self, headers: Mapping[str, str]) -> TenantAccess:
        """The tenant whose live key was presented; 401 without one."""
        record = lookup(self.table.keys, presented_key(headers))
        if record is None:
            raise GatewayError(401, INVALID_KEY, ErrorCode.INVALID_API_KEY)
        return record.tenant

    def admin_refusal(self, headers: Mapping[str, str]) -> str | None:
        """None when the admin key is not configured or was presented; else why not."""
        if self.admin is None:
            return None
        key = presented_key(headers)
        key_id, mac, digest = self.admin
        if key is None or apikeys.key_id(key) != key_id or not apikeys.matches(key, mac, digest):
            return "this path needs the admin key (Authorization: Bearer <key>)"
        return None
