"""A Tenant and API keys under ``llmplane up``: the team-a Tenant, an admin key, a Bearer header,
a call made once the gateway knows the key, a raw GET."""

from __future__ import annotations

from pathlib import Path

import openai

from tests.integration.upcli import cli

TENANT = """
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: team-a}
spec:
  models: ["tiny-a*"]
  criticality: Critical
"""


def admin_key(tmp_path: Path) -> tuple[str, Path]:
    """A fresh admin key and a gateway config naming its hash (``llmplane keys admin``)."""
    lines = cli("keys", "admin", state_dir=None).stdout.splitlines()
    key = lines[1]
    config = tmp_path / "gateway.yaml"
    config.write_text("\n".join(lines[3:]) + "\n")
    return key, config


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def authenticated(call):
    """``call()``, or None while the gateway refuses the key (it has not seen the key yet)."""
    try:
        return call()
    except openai.AuthenticationError:
        return None  # the gateway has not seen the new key yet


def raw(url: str, headers: dict[str, str]) -> str:
    """A GET's body as text (a /metrics page, not JSON)."""
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as r:
        return r.read().decode()
