"""API keys, the tenant table and the gateway's key check (``gateway/apikeys.py``,
``gateway/auth.py``), and ``llmplane keys`` on a real SQLite store (``keys.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmplane.api.documents import InvalidResources, parse_document
from llmplane.gateway import apikeys
from llmplane.gateway.auth import Authenticator, TenantTable, lookup, presented_key
from llmplane.gateway.config import ConfigFileError, load_checked
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.exposure import is_loopback
from llmplane.keys import KeyError_, create_key, list_keys, revoke_key
from llmplane.store.sqlite import SQLiteStore


def tenant(name: str, keys: list[dict], models: list[str] | None = None) -> dict:
    spec: dict = {"keys": keys}
    if models is not None:
        spec["models"] = models
    return {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def stored(made: apikeys.NewKey, **extra: object) -> dict:
    return {"id": made.id, "salt": made.salt, "hash": made.hash, **extra}


def test_keys_are_random_salted_and_checked() -> None:
    a, b = apikeys.new_key(), apikeys.new_key()
    assert a.key != b.key and a.salt != b.salt
    assert apikeys.key_id(a.key) == a.id and len(a.id) == apikeys.ID_LENGTH
    mac, digest = apikeys.keyed(bytes.fromhex(a.salt)), bytes.fromhex(a.hash)
    assert apikeys.matches(a.key, mac, digest)
    assert not apikeys.matches(b.key, mac, digest)
    # The same key under another salt has another hash.
    assert apikeys.digest(a.key, b.salt) != a.hash
    assert a.key not in a.hash and a.key.split("-", 2)[2] not in repr(stored(a))
    for bad in ("", "llmp-", "sk-" + a.key[3:], a.key.replace("-", "_"), "llmp-short-x"):
        assert apikeys.key_id(bad) is None, bad


def test_presented_key_from_bearer_or_x_api_key() -> None:
    assert presented_key({"authorization": "Bearer abc"}) == "abc"
    assert presented_key({"authorization": "bearer  abc "}) == "abc"
    assert presented_key({"x-api-key": "abc"}) == "abc"
    assert presented_key({"authorization": "Basic abc"}) is None
    assert presented_key({}) is None


def test_a_key_id_two_tenants_claim_is_refused_for_both() -> None:
    made, other = apikeys.new_key(), apikeys.new_key()
    clash = {**stored(other), "id": made.id}  # another tenant's key under made's id
    alone = TenantTable([tenant("a", [stored(made)])])
    assert lookup(alone.keys, made.key) is not None
    table = TenantTable([tenant("a", [stored(made)]), tenant("b", [clash])])
    assert lookup(table.keys, made.key) is None
    assert lookup(table.keys, f"llmp-{made.id}-{other.key.split('-', 2)[2]}") is None
    three = TenantTable([tenant(n, [stored(made)]) for n in ("a", "b", "c")])
    assert lookup(three.keys, made.key) is None


def test_authenticator_checks_keys_models_and_revocation() -> None:
    good, revoked, other = apikeys.new_key(), apikeys.new_key(), apikeys.new_key()
    auth = Authenticator()
    assert auth.authenticate({}) is None  # no Tenant on loopback: open
    auth.update(
        [
            tenant("a", [stored(good), stored(revoked, revoked=True)], ["llama-*", "exact"]),
            {"kind": "ModelRoute", "metadata": {"name": "x"}},
        ]
    )
    found = auth.authenticate({"authorization": f"Bearer {good.key}"})
    assert found is not None and found.name == "a"
    auth.permit(found, "llama-3")
    auth.permit(found, "exact")
    for model in ("exact2", "mistral", ""):
        with pytest.raises(GatewayError) as refused:
            auth.permit(found, model)
        assert (refused.value.status, refused.value.code) == (403, "model_not_allowed")
    for headers in (
        {},
        {"authorization": f"Bearer {revoked.key}"},
        {"authorization": f"Bearer {other.key}"},
        {"x-api-key": good.key[:-1] + "x"},
    ):
        with pytest.raises(GatewayError) as refused:
            auth.authenticate(headers)
        assert (refused.value.status, refused.value.code) == (401, "invalid_api_key")


def test_a_key_is_checked_on_every_request_and_refused_once_revoked() -> None:
    """A wrong key is refused every time; revoking (a new table) refuses the key at once
    while the tenant's other key still passes."""
    good, other = apikeys.new_key(), apikeys.new_key()
    auth = Authenticator()
    auth.update([tenant("a", [stored(good), stored(other)])])
    bearer = {"authorization": f"Bearer {good.key}"}
    for _ in range(3):
        assert auth.authenticate(bearer).name == "a"
    wrong = good.key[:-1] + ("x" if good.key[-1] != "x" else "y")
    for _ in range(2):
        with pytest.raises(GatewayError):
            auth.authenticate({"authorization": f"Bearer {wrong}"})
    with pytest.raises(GatewayError):
        auth.authenticate({"authorization": f"Bearer {good.key * 3}"})
    auth.update([tenant("a", [stored(good, revoked=True), stored(other)])])
    with pytest.raises(GatewayError) as refused:
        auth.authenticate(bearer)
    assert refused.value.status == 401
    assert auth.authenticate({"x-api-key": other.key}).name == "a"


def test_a_key_is_answered_alike_however_it_is_presented() -> None:
    """A Bearer key (first seen or remembered, any case of the scheme, spaces around it), an
    x-api-key, another scheme beside an x-api-key: the key's tenant; a wrong, an overlong or
    an empty key: 401."""
    good, other = apikeys.new_key(), apikeys.new_key()
    auth = Authenticator()
    auth.update([tenant("a", [stored(good), stored(other)])])
    bearer = {"authorization": f"Bearer {good.key}"}
    for headers in (
        bearer,
        bearer,
        {"authorization": f"bearer  {good.key} "},
        {"x-api-key": good.key},
        {"authorization": "Basic abc", "x-api-key": other.key},
    ):
        assert auth.authenticate(headers).name == "a"
    for headers in (
        {"authorization": f"Bearer {good.key[:-1]}x"},
        {"authorization": f"Bearer {good.key * 3}"},
        {"authorization": "Bearer "},
    ):
        with pytest.raises(GatewayError) as refused:
            auth.authenticate(headers)
        assert refused.value.status == 401


def test_beyond_loopback_without_tenants_refuses_everything() -> None:
    auth = Authenticator()
    auth.loopback = is_loopback("0.0.0.0")
    assert not auth.loopback and auth.enabled
    with pytest.raises(GatewayError) as refused:
        auth.authenticate({"authorization": "Bearer llmp-aaaaaaaaaaaa-x"})
    assert refused.value.status == 401
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))


def test_one_key_id_in_two_tenants_trusts_neither() -> None:
    made = apikeys.new_key()
    table = TenantTable([tenant("a", [stored(made)]), tenant("b", [stored(made)])])
    auth = Authenticator()
    auth.table = table
    with pytest.raises(GatewayError):
        auth.authenticate({"x-api-key": made.key})


def test_admin_key(tmp_path: Path) -> None:
    made = apikeys.new_key()
    auth = Authenticator(apikeys.admin_setting(made))
    assert auth.admin_refusal({"x-api-key": made.key}) is None
    assert auth.admin_refusal({}) is not None
    assert auth.admin_refusal({"x-api-key": apikeys.new_key().key}) is not None
    forged = made.key[: -len("secret")] + "secret"  # the admin key's id, another secret
    assert forged != made.key and auth.admin_refusal({"x-api-key": forged}) is not None
    assert Authenticator().admin_refusal({}) is None  # no admin key: open
    config = tmp_path / "gateway.yaml"
    config.write_text("gateway:\n  adminKeyHash: not-a-hash\n")
    with pytest.raises(ConfigFileError, match="adminKeyHash"):
        load_checked(config)


def test_tenant_validation_names_the_field() -> None:
    doc = tenant("a", [{"id": "UPPER", "salt": "zz", "hash": "00"}], ["has space"])
    with pytest.raises(InvalidResources) as err:
        parse_document(doc)
    text = "\n".join(err.value.messages)
    for path in ("spec.models[0]", "spec.keys[0].id", "spec.keys[0].salt", "spec.keys[0].hash"):
        assert path in text
    made = apikeys.new_key()
    with pytest.raises(InvalidResources, match="duplicate key id"):
        parse_document(tenant("a", [stored(made), stored(made)]))


def test_keys_create_list_revoke_on_sqlite(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "state.db") as store:
        made, created = create_key(store, "team", name="ci")
        second, created_again = create_key(store, "team")
        assert created and not created_again
        rows = list_keys(store)
        assert [r["id"] for r in rows] == [made.id, second.id]
        assert all(set(r) == {"tenant", "id", "name", "created", "revoked"} for r in rows)
        revoke_key(store, "team", made.id)
        assert [r["revoked"] for r in list_keys(store, "team")] == [True, False]
        obj = store.get("Tenant", "team", "default")
        assert obj["spec"]["models"] == ["*"] and obj["spec"]["criticality"] == "Default"
        with pytest.raises(KeyError_, match="no key"):
            revoke_key(store, "team", "nope")
        with pytest.raises(KeyError_, match="not found"):
            list_keys(store, "nobody")
    assert made.key.encode() not in (tmp_path / "state.db").read_bytes()


def test_models_are_allowed_by_name_or_glob() -> None:
    from llmplane.gateway.auth import TenantAccess

    t = TenantAccess("a", ("llama-*", "exact"), "Default")
    assert t.allows("llama-3") and t.allows("exact") and not t.allows("mistral")
    assert not t.allows("exactly") and not t.allows("x-llama-3")


def test_unvalidated_objects_cannot_break_the_table() -> None:
    """A Tenant written around validation (a hand-made custom resource) costs its bad key
    only; an empty model list allows nothing."""
    good = apikeys.new_key()
    auth = Authenticator()
    auth.update(
        [
            tenant("bad", [{"id": "x", "salt": "not hex", "hash": 3}, {"salt": "00"}], []),
            tenant("a", [stored(good)], []),
        ]
    )
    found = auth.authenticate({"x-api-key": good.key})
    assert found is not None and found.name == "a" and not found.allows("anything")


def test_secret_ref_keys_validate_and_resolve_from_secrets() -> None:
    import base64

    made = apikeys.new_key()
    ok, _ = parse_document(tenant("a", [{"id": made.id, "secretRef": {"name": "a-key"}}]))
    assert ok.to_dict()["spec"]["keys"][0] == {
        "id": made.id,
        "secretRef": {"name": "a-key"},
        "revoked": False,
    }
    for key, path, message in (
        ({"id": made.id}, "spec.keys[0]", "needs salt and hash (or secretRef"),
        (
            {**stored(made), "secretRef": {"name": "a-key"}},
            "spec.keys[0].secretRef",
            "give either salt and hash or secretRef",
        ),
        (
            {"id": made.id, "secretRef": {"name": "A_Key"}},
            "spec.keys[0].secretRef.name",
            "must be a Secret name",
        ),
    ):
        with pytest.raises(InvalidResources) as err:
            parse_document(tenant("a", [key]))
        assert f"{path}: {message}" in "\n".join(err.value.messages)

    def secret(name: str, namespace: str = "default", **fields: object) -> dict:
        return {"kind": "Secret", "metadata": {"name": name, "namespace": namespace}, **fields}

    b64 = {k: base64.b64encode(v.encode()).decode() for k, v in stored(made).items()}
    ref = [{"id": made.id, "secretRef": {"name": "a-key"}}]
    good = secret("a-key", data={"salt": b64["salt"], "hash": b64["hash"]})
    plain = secret("a-key", stringData={"salt": made.salt, "hash": made.hash})
    for secret_obj in (good, plain):
        table = TenantTable([tenant("a", ref), secret_obj])
        assert lookup(table.keys, made.key) is not None
    # Missing, in another namespace, or not base64: refused (never an exception).
    for objects in (
        [tenant("a", ref)],
        [tenant("a", ref), secret("a-key", "other", data=good["data"])],
        [tenant("a", ref), secret("a-key", data={"salt": "!!", "hash": "??"})],
        [tenant("a", ref), secret("a-key", data={"salt": b64["salt"]})],
    ):
        assert lookup(TenantTable(objects).keys, made.key) is None


def test_keys_create_with_a_secret_names_it_and_the_secret_checks_the_key(tmp_path: Path) -> None:
    from llmplane.keys import key_secret

    store = SQLiteStore(tmp_path / "s.db")
    try:
        made, _ = create_key(store, "team-a", secret="team-a-key")
        stored_tenant = store.get("Tenant", "team-a", "default")
    finally:
        store.close()
    [key] = stored_tenant["spec"]["keys"]
    assert key["secretRef"] == {"name": "team-a-key"} and "salt" not in key and "hash" not in key
    secret = key_secret(made, "team-a-key", "team-a")
    assert secret["metadata"]["labels"] == {"llmplane.io/api-key": "team-a"}
    assert made.key not in repr(secret)
    assert lookup(TenantTable([stored_tenant, secret]).keys, made.key).tenant.name == "team-a"
    assert lookup(TenantTable([stored_tenant]).keys, made.key) is None
