"""Where models live in a pod and how they get there: paths, loader init containers, credentials."""

from __future__ import annotations

from typing import Any

from llmplane.api.llmaz import OpenModel, split_uri
from llmplane.controlplane.plan import (
    SKIP_LOADER_ANNOTATION,
)
from llmplane.controlplane.planning import PlanningError
from llmplane.loader.locate import locate
from llmplane.runtime.kube.base import (
    LOADER_NAME,
    MODEL_MOUNT_PATH,
    MODEL_VOLUME,
    MODELS_ROOT,
    KubeOptions,
)

# Secrets llmaz reads credentials from (each key optional: a missing secret leaves it unset).
MODELHUB_SECRET = "modelhub-secret"
AWS_SECRET = "aws-access-secret"
OSS_SECRET = "oss-access-secret"
_CREDENTIALS: dict[str, list[tuple[str, str, str]]] = {
    # source kind -> [(env name, secret name, key)]
    "huggingface": [
        ("HUGGING_FACE_HUB_TOKEN", MODELHUB_SECRET, "HF_TOKEN"),
        ("HF_TOKEN", MODELHUB_SECRET, "HF_TOKEN"),
    ],
    "modelscope": [("MODELSCOPE_API_TOKEN", MODELHUB_SECRET, "MODELSCOPE_API_TOKEN")],
    "s3": [
        ("AWS_ACCESS_KEY_ID", AWS_SECRET, "AWS_ACCESS_KEY_ID"),
        ("AWS_SECRET_ACCESS_KEY", AWS_SECRET, "AWS_SECRET_ACCESS_KEY"),
    ],
    "oss": [
        ("OSS_ACCESS_KEY_ID", OSS_SECRET, "OSS_ACCESS_KEY_ID"),
        ("OSS_ACCESS_KEY_SECRET", OSS_SECRET, "OSS_ACCESS_KEY_SECRET"),
    ],
    "gcs": [],  # Application Default Credentials: workload identity, no secret
}
CREDENTIAL_NAMES = {name for entries in _CREDENTIALS.values() for name, _, _ in entries}


# Model locations ----------------------------------------------------------------------------


def skips_loader(model: OpenModel) -> bool:
    """``llmaz.io/skip-model-loader: "true"`` on the OpenModel: the engine fetches the model."""
    return (model.metadata.annotations or {}).get(SKIP_LOADER_ANNOTATION) == "true"


def source_kind(model: OpenModel) -> str:
    """huggingface, modelscope, s3, oss, gcs, host or ollama (``package://`` is embedded-only)."""
    source = model.spec.source
    if source.model_hub is not None:
        return "huggingface" if source.model_hub.name == "Huggingface" else "modelscope"
    assert source.uri is not None
    proto, _ = split_uri(source.uri)
    if proto == "package":
        raise PlanningError(
            f"OpenModel/{model.name}: package:// models exist only on the embedded substrate "
            "(llmplane up); on Kubernetes use a hub, an object store or host://",
            reason="AbortProcessing",
        )
    return proto


def pod_model_path(model: OpenModel) -> str:
    """``{{ .ModelPath }}`` inside the pod: the loader's layout under ``/workspace/models``.

    With the skip-model-loader annotation, the engine loads by itself: the hub model id, or the
    object store URI (as llmaz). ``host://p`` is ``p``; ``ollama://tag`` the tag.
    """
    kind = source_kind(model)
    source = model.spec.source
    _, address = split_uri(source.uri) if source.uri else ("", "")
    if kind in ("host", "ollama"):
        return address
    if skips_loader(model):
        if source.model_hub is not None:
            return source.model_hub.model_id
        return source.uri or ""
    return str(locate(source, MODELS_ROOT).path)


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {
        "name": name,
        "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}},
    }


def credential_env(kind: str) -> list[dict[str, Any]]:
    return [_secret_env(n, s, k) for n, s, k in _CREDENTIALS.get(kind, [])]


def loader_args(model: OpenModel) -> list[str]:
    """``llmplane load-model`` arguments for a model (the source as flags)."""
    source = model.spec.source
    args = ["load-model"]
    if source.model_hub is not None:
        hub = source.model_hub
        args += ["--hub", hub.name, "--model-id", hub.model_id, "--revision", hub.revision]
        if hub.filename:
            args += ["--filename", hub.filename]
        for pattern in hub.allow_patterns or []:
            args += ["--allow-pattern", pattern]
        for pattern in hub.ignore_patterns or []:
            args += ["--ignore-pattern", pattern]
    else:
        assert source.uri is not None
        args += ["--uri", source.uri]
    return [*args, "--cache-dir", MODELS_ROOT]


def loader_container(
    index: int, model: OpenModel, runner_env: list[dict[str, Any]], options: KubeOptions
) -> dict[str, Any]:
    env = [e for e in runner_env if e.get("name") not in CREDENTIAL_NAMES]
    env += credential_env(source_kind(model))
    container: dict[str, Any] = {
        "name": LOADER_NAME if index == 0 else f"{LOADER_NAME}-{index}",
        "image": options.image,
        "command": ["llmplane"],
        "args": loader_args(model),
        "volumeMounts": [{"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT_PATH}],
    }
    if env:
        container["env"] = env
    if options.image_pull_policy:
        container["imagePullPolicy"] = options.image_pull_policy
    return container
