"""Gateway API Inference Extension objects (v1alpha2) for the endpoint picker's tests: an
InferencePool whose extension is llmplane's endpoint picker, an InferenceModel."""

from __future__ import annotations

GIE = "inference.networking.x-k8s.io/v1alpha2"


def pool(name: str, selector: dict, failure_mode: str = "FailOpen") -> dict:
    return {
        "apiVersion": GIE,
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": selector,
            "targetPortNumber": 8000,
            "extensionRef": {
                "name": "llmplane-epp",
                "portNumber": 9002,
                "failureMode": failure_mode,
            },
        },
    }


def inference_model(name: str, pool_name: str, targets: list[dict], criticality="Critical"):
    return {
        "apiVersion": GIE,
        "kind": "InferenceModel",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "modelName": name,
            "criticality": criticality,
            "poolRef": {"name": pool_name},
            "targetModels": targets,
        },
    }
