"""API keys: how they are made, what is stored of them, how a presented key is checked.

A key reads ``llmp-<id>-<secret>``: ``id`` is 12 random base-36 characters, public (listed by
``llmplane keys list``, written in the Tenant, used by the gateway to find the key's record
in one dict lookup); ``secret`` is 32 random bytes (URL-safe base64). Only
``HMAC-SHA256(salt, key)`` with a per-key 16-byte random salt is stored.

Why a fast salted hash and not a slow KDF (bcrypt, scrypt, argon2): slow KDFs exist to make
guessing *low-entropy* secrets (passwords) expensive. A 256-bit random secret cannot be
guessed however fast the hash is, so a slow KDF would buy nothing and would cost every
request milliseconds of CPU on the gateway's event loop. The salt keeps equal keys from
having equal hashes and defeats precomputed tables; the comparison is constant-time
(``hmac.compare_digest``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

PREFIX = "llmp-"
ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
ID_LENGTH = 12
SECRET_BYTES = 32


@dataclass(frozen=True)
class NewKey:
    """A freshly made key: ``key`` is shown to the user once; the rest is stored."""

    id: str
    key: str
    salt: str
    hash: str


def digest(key: str, salt_hex: str) -> str:
    """The stored form of ``key``: hex HMAC-SHA256 keyed by the salt."""
    return hmac.digest(bytes.fromhex(salt_hex), key.encode(), hashlib.sha256).hex()


def new_key() -> NewKey:
    key_id = "".join(secrets.choice(ID_ALPHABET) for _ in range(ID_LENGTH))
    secret = base64.urlsafe_b64encode(secrets.token_bytes(SECRET_BYTES)).rstrip(b"=").decode()
    key = f"{PREFIX}{key_id}-{secret}"
    salt = secrets.token_hex(16)
    return NewKey(key_id, key, salt, digest(key, salt))


def key_id(key: str) -> str | None:
    """The public id inside a presented key, or None when it does not look like one of ours."""
    if len(key) < len(PREFIX) + ID_LENGTH + 2 or not key.startswith(PREFIX):
        return None
    end = len(PREFIX) + ID_LENGTH
    if key[end] != "-":
        return None
    return key[len(PREFIX) : end]


def keyed(salt: bytes) -> hmac.HMAC:
    """An HMAC-SHA256 keyed by ``salt`` and not yet fed: ``matches`` copies it instead of
    keying a new one for every request."""
    return hmac.new(salt, digestmod=hashlib.sha256)


def matches(key: str, mac: hmac.HMAC, hash_: bytes) -> bool:
    """Whether ``key`` is the one stored as ``hash_`` under the salt ``mac`` is keyed with
    (``keyed``): one HMAC in C from a copied key state, one constant-time comparison."""
    mac = mac.copy()
    mac.update(key.encode())
    return hmac.compare_digest(mac.digest(), hash_)


def admin_setting(key: NewKey) -> str:
    """The ``gateway.adminKeyHash`` value for an admin key: ``<id>:<salt>:<hash>``."""
    return f"{key.id}:{key.salt}:{key.hash}"


def parse_admin_setting(value: str) -> tuple[str, str, str]:
    """``gateway.adminKeyHash`` as (id, salt, hash); ValueError says what is wrong."""
    parts = value.split(":")
    if len(parts) != 3 or len(parts[1]) != 32 or len(parts[2]) != 64:
        raise ValueError(
            "gateway.adminKeyHash: expected ID:SALT:HASH as `llmplane keys admin` prints it"
        )
    try:
        bytes.fromhex(parts[1] + parts[2])
    except ValueError:
        raise ValueError("gateway.adminKeyHash: SALT and HASH must be hex") from None
    return parts[0], parts[1], parts[2]
