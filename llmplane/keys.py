"""``llmplane keys create|list|revoke|admin``: a Tenant's API keys in the store.

A new key is printed once and never again: the Tenant keeps only its id, salt and hash
(``llmplane/gateway/apikeys.py``). Every change is a read-modify-apply of the whole Tenant
with its resourceVersion, retried on a conflict, so two concurrent ``keys create`` both land.
Nothing is written when the result would not validate.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from llmplane.api.documents import dump_resource, parse_document
from llmplane.api.llmplane import API_KEY_SECRET_LABEL
from llmplane.gateway import apikeys
from llmplane.store.base import Conflict, Store

KIND = "Tenant"
API_VERSION = "llmplane.io/v1alpha1"

app = typer.Typer(
    help="API keys of Tenants (the gateway requires one once any Tenant exists).",
    no_args_is_help=True,
)


class KeyError_(Exception):
    """A mistake the user can fix (no such tenant or key)."""


def _change(
    store: Store,
    tenant: str,
    namespace: str | None,
    edit: Callable[[dict[str, Any]], None],
    create: bool = False,
) -> dict[str, Any]:
    """Apply ``edit`` to the Tenant's spec (creating the Tenant if ``create``), validated."""
    namespace = namespace or "default"
    for _ in range(5):
        current = store.get(KIND, tenant, namespace)
        if current is None:
            if not create:
                raise KeyError_(f"Tenant/{tenant} not found")
            doc: dict[str, Any] = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": tenant, "namespace": namespace},
                "spec": {},
            }
        else:
            doc = {
                "apiVersion": current["apiVersion"],
                "kind": KIND,
                "metadata": dict(current["metadata"]),
                "spec": dict(current.get("spec") or {}),
            }
        edit(doc["spec"])
        resource, _ = parse_document(doc)  # raises InvalidResources: nothing stored
        try:
            # This command owns spec.keys (Tenant.api_owned): it may drop and change keys.
            return store.apply(dump_resource(resource), force_conflicts=True)
        except Conflict:
            continue
    raise KeyError_(f"Tenant/{tenant} keeps changing; try again")


def create_key(
    store: Store,
    tenant: str,
    name: str | None = None,
    namespace: str | None = None,
    secret: str | None = None,
) -> tuple[apikeys.NewKey, bool]:
    """A new key for ``tenant`` (the Tenant is created, allowing every model, if missing);
    returns the key and whether the Tenant was created. With ``secret`` the Tenant names
    that Secret (``secretRef``) instead of holding the salt and hash: see ``key_secret``."""
    made = apikeys.new_key()
    existed = store.get(KIND, tenant, namespace or "default") is not None
    record: dict[str, Any] = {"id": made.id}
    if secret is None:
        record.update(salt=made.salt, hash=made.hash)
    else:
        record["secretRef"] = {"name": secret}
    record["created"] = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    if name:
        record["name"] = name

    def add(spec: dict[str, Any]) -> None:
        spec["keys"] = [*(spec.get("keys") or []), record]

    _change(store, tenant, namespace, add, create=True)
    return made, not existed


def revoke_key(store: Store, tenant: str, key_id: str, namespace: str | None = None) -> None:
    def revoke(spec: dict[str, Any]) -> None:
        keys = [dict(k) for k in spec.get("keys") or []]
        for key in keys:
            if key.get("id") == key_id:
                key["revoked"] = True
                break
        else:
            raise KeyError_(f"Tenant/{tenant} has no key {key_id!r} (see `llmplane keys list`)")
        spec["keys"] = keys

    _change(store, tenant, namespace, revoke)


def list_keys(
    store: Store, tenant: str | None = None, namespace: str | None = None
) -> list[dict[str, Any]]:
    """One row per key: tenant, id, name, created, revoked (never salt or hash)."""
    if tenant is not None:
        one = store.get(KIND, tenant, namespace or "default")
        if one is None:
            raise KeyError_(f"Tenant/{tenant} not found")
        tenants = [one]
    else:
        tenants = store.list(KIND, namespace)
    rows = []
    for obj in tenants:
        for key in (obj.get("spec") or {}).get("keys") or []:
            rows.append(
                {
                    "tenant": obj["metadata"]["name"],
                    "id": key["id"],
                    "name": key.get("name") or "",
                    "created": key.get("created") or "",
                    "revoked": bool(key.get("revoked")),
                }
            )
    return rows


def key_secret(
    made: apikeys.NewKey, secret: str, tenant: str, namespace: str | None = None
) -> dict[str, Any]:
    """The Secret a ``secretRef`` key names: its salt and hash (never the key), labelled so
    the in-cluster gateway (``--key-secrets``) reads it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret,
            "namespace": namespace or "default",
            "labels": {API_KEY_SECRET_LABEL: tenant},
        },
        "type": "Opaque",
        "stringData": {"salt": made.salt, "hash": made.hash},
    }


# --- the commands (registered on ``llmplane`` by cli.py) ----------------------------------------

Namespace = Annotated[str | None, typer.Option("-n", "--namespace", help="Namespace.")]


def _store(state_dir: Any) -> Store:
    from llmplane.store.paths import open_store

    return open_store(state_dir)


StateDir = Annotated[
    str | None,
    typer.Option("--state-dir", help="State directory (default: $LLMPLANE_HOME or ~/.llmplane)."),
]


@app.command("create")
def create_command(
    tenant: str,
    name: Annotated[str | None, typer.Option("--name", help="A label for the key.")] = None,
    secret: Annotated[
        str | None,
        typer.Option(
            "--secret",
            help="Keep the salt and hash in this Kubernetes Secret (printed as YAML to apply) "
            "and name it in the Tenant (keys[].secretRef) instead.",
        ),
    ] = None,
    namespace: Namespace = None,
    state_dir: StateDir = None,
) -> None:
    """Make a key for TENANT (creating the Tenant if needed) and print it, once."""
    store = _store(state_dir)
    try:
        made, created = create_key(store, tenant, name, namespace, secret)
    finally:
        store.close()
    if secret is not None:
        import yaml

        typer.echo("# The Secret with the key's salt and hash: kubectl apply it with the Tenant")
        typer.echo(yaml.safe_dump(key_secret(made, secret, tenant, namespace), sort_keys=False))
    if created:
        typer.echo(f"tenant.llmplane.io/{tenant} created (allows every model; edit spec.models)")
    typer.echo(f"key id {made.id} created for Tenant/{tenant}. The key (shown only now):")
    typer.echo(made.key)


@app.command("list")
def list_command(
    tenant: Annotated[str | None, typer.Argument()] = None,
    namespace: Namespace = None,
    state_dir: StateDir = None,
) -> None:
    """List keys (ids, names, state; never the keys themselves)."""
    store = _store(state_dir)
    try:
        rows = list_keys(store, tenant, namespace)
    finally:
        store.close()
    typer.echo(f"{'TENANT':<20} {'ID':<13} {'NAME':<20} {'CREATED':<21} STATE")
    for r in rows:
        state = "revoked" if r["revoked"] else "active"
        typer.echo(f"{r['tenant']:<20} {r['id']:<13} {r['name']:<20} {r['created']:<21} {state}")


@app.command("revoke")
def revoke_command(
    tenant: str, key_id: str, namespace: Namespace = None, state_dir: StateDir = None
) -> None:
    """Revoke TENANT's key KEY_ID (the gateway refuses it within moments)."""
    store = _store(state_dir)
    try:
        revoke_key(store, tenant, key_id, namespace)
    finally:
        store.close()
    typer.echo(f"key {key_id} of Tenant/{tenant} revoked")


@app.command("admin")
def admin_command() -> None:
    """Make an admin key (for /metrics and the console API) and print it with its setting."""
    made = apikeys.new_key()
    typer.echo("The admin key (shown only now):")
    typer.echo(made.key)
    typer.echo("Put this in the gateway's --config file:")
    typer.echo(f"gateway:\n  adminKeyHash: {apikeys.admin_setting(made)}")
