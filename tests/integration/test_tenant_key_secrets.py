"""Tenant keys whose salt and hash live in a Secret (``keys[].secretRef``), read by the
in-cluster gateway (``--kubernetes --key-secrets``) from a Kubernetes API EMULATOR
(``llmplane.testing.kube_emulator``: no API server can run here; it implements list/watch with
label selectors as the real one does). The gateway, its KubeStore and the engine (a real
simulated one, registered by an llmplane.io Endpoint) are real.

Checked: a key whose hash is in a labelled Secret is served; a Secret without the label is
never read into the gateway; rotating the Secret's hash switches keys without touching the
Tenant; deleting the Secret refuses the key; nothing works without ``key_secrets``."""

from __future__ import annotations

import base64
import secrets
from typing import Any

import aiohttp

from llmplane.gateway import apikeys
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.pods import kubernetes_sources
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.server import start_gateway
from llmplane.testing import eventually
from llmplane.testing.kube_emulator import KubeEmulator

MODEL = "keyed"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def key_secret(name: str, salt: str, hash_: str, labelled: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if labelled:
        meta["labels"] = {"llmplane.io/api-key": "team-a"}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {"salt": b64(salt), "hash": b64(hash_)},
    }


def same_id_key(made: apikeys.NewKey) -> tuple[str, str, str]:
    """Another key under ``made``'s id (a rotation): (key, salt, hash)."""
    key = f"{apikeys.PREFIX}{made.id}-{secrets.token_urlsafe(32)}"
    salt = secrets.token_hex(16)
    return key, salt, apikeys.digest(key, salt)


async def status_with(port: int, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": MODEL, "prompt": "hi", "max_tokens": 1},
            headers=headers,
        ) as resp,
    ):
        await resp.read()
        return resp.status


async def test_key_hash_from_a_labelled_secret_rotates_and_revokes(processes) -> None:
    engine = processes.sim(MODEL, "--time-scale", "0")
    made = apikeys.new_key()
    async with KubeEmulator() as kube:
        await kube.create(endpoint_object("sim", engine.address, MODEL, engine="sim"))
        await kube.create(
            {
                "apiVersion": "llmplane.io/v1alpha1",
                "kind": "Tenant",
                "metadata": {"name": "team-a", "namespace": "default"},
                "spec": {"keys": [{"id": made.id, "secretRef": {"name": "team-a-key"}}]},
            }
        )
        await kube.create(key_secret("team-a-key", made.salt, made.hash))
        await kube.create(key_secret("unrelated", "00" * 16, "00" * 32, labelled=False))

        # Without --key-secrets the gateway reads no Secret: the key cannot be checked.
        store, discovery = await kubernetes_sources(None, kube.url)
        gateway = await start_gateway(store, discovery, config=GatewayConfig())
        try:
            await eventually(lambda: gateway.auth.table.tenants == 1, what="the Tenant seen")
            assert await status_with(gateway.port, made.key) == 401
        finally:
            await gateway.close()
            await store.aclose()

        store, discovery = await kubernetes_sources(None, kube.url, key_secrets=True)
        gateway = await start_gateway(store, discovery, config=GatewayConfig())
        try:
            port = gateway.port
            await eventually(
                lambda: made.id in gateway.auth.table.keys and gateway.registry.states,
                what="the key (from its Secret) and the endpoint seen",
            )
            assert await status_with(port, made.key) == 200
            assert await status_with(port, None) == 401
            # Only labelled Secrets reach the gateway.
            assert store.get("Secret", "team-a-key", "default") is not None
            assert store.get("Secret", "unrelated", "default") is None

            # Rotate: a new key under the same id, only the Secret changes.
            new_key, salt, digest = same_id_key(made)
            await kube.patch(
                "v1",
                "Secret",
                "team-a-key",
                "default",
                {"data": {"salt": b64(salt), "hash": b64(digest)}},
            )
            await eventually(
                lambda: gateway.auth.table.keys[made.id].hash == bytes.fromhex(digest),
                what="the rotated Secret seen",
            )
            assert await status_with(port, new_key) == 200
            assert await status_with(port, made.key) == 401

            # The Secret deleted: the key is refused.
            await kube.delete("v1", "Secret", "team-a-key", "default")
            await eventually(lambda: made.id not in gateway.auth.table.keys, what="Secret gone")
            assert await status_with(port, new_key) == 401
        finally:
            await gateway.close()
            await store.aclose()
