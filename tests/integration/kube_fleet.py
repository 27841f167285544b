"""A fleet under the Kubernetes API emulator: sims listening on loopback pod IPs at port 8080,
and the llmaz and Kthena objects that name them."""

from __future__ import annotations

import random
import socket
from typing import Any

import pytest

from llmplane.testing import Process

KTHENA = "networking.serving.volcano.sh/v1alpha1"


MODEL_LABEL = "llmaz.io/model-name"


BACKEND_LABEL = "inference.llmaz.io/backend-name"


MODEL = "llama"


def free_loopback_prefix() -> str:
    """``127.X.Y`` whose .2, .3, .4 can bind port 8080 (random: parallel runs do not collide)."""
    for _ in range(50):
        prefix = f"127.{random.randint(1, 254)}.{random.randint(0, 254)}"
        try:
            for host in (2, 3, 4):
                with socket.socket() as s:
                    s.bind((f"{prefix}.{host}", 8080))
        except OSError:
            continue
        return prefix
    pytest.skip("no loopback address with port 8080 free (something listens on *:8080)")


def ip(server: Process) -> str:
    return server.address.rpartition(":")[0]


def openmodel(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "llmaz.io/v1alpha1",
        "kind": "OpenModel",
        "metadata": {"name": name},
        "spec": {"familyName": name, "source": {"modelHub": {"modelID": f"org/{name}"}}},
    }


def playground(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 1, "modelClaim": {"modelName": name}},
    }


def model_server(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": KTHENA,
        "kind": "ModelServer",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "model": MODEL,
            "inferenceEngine": "vLLM",
            "workloadSelector": {"matchLabels": labels},
            **spec,
        },
    }
