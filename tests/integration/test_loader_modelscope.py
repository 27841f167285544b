"""ModelScope loading through the modelscope library against a local server (MODELSCOPE_ENDPOINT)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmplane.api.llmaz import ModelHub, ModelSource
from llmplane.loader import LoadError, load_model
from tests.integration.loader_servers import FakeModelScope, fake_modelscope

__all__ = ["fake_modelscope"]

pytest.importorskip("modelscope")

WEIGHTS = bytes(range(256)) * 5000
FILES = {"config.json": b'{"a": 1}', "model.safetensors": WEIGHTS, "README.md": b"# hi"}


def source(model_id: str = "qwen/tiny", **kwargs: object) -> ModelSource:
    return ModelSource(model_hub=ModelHub(name="ModelScope", model_id=model_id, **kwargs))


def test_snapshot_with_patterns_and_progress(
    fake_modelscope: FakeModelScope, tmp_path: Path
) -> None:
    fake_modelscope.repos["qwen/tiny"] = FILES
    calls: list[tuple[int, int | None]] = []

    path = load_model(
        source(allow_patterns=["*.json", "*.safetensors"]),
        tmp_path,
        lambda d, t: calls.append((d, t)),
    )

    assert path == tmp_path / "modelscope" / "models--qwen--tiny"
    assert (path / "model.safetensors").read_bytes() == WEIGHTS
    assert not (path / "README.md").exists()
    size = len(WEIGHTS) + len(FILES["config.json"])
    assert calls[-1] == (size, size)
    assert fake_modelscope.file_gets("README.md") == []
    # llmaz's default revision "main" means ModelScope's default branch
    assert all(r.query.get("Revision") in (None, "master") for r in fake_modelscope.requests)


def test_finished_model_is_not_checked_again(
    fake_modelscope: FakeModelScope, tmp_path: Path
) -> None:
    fake_modelscope.repos["qwen/tiny"] = FILES
    load_model(source(), tmp_path)
    seen = len(fake_modelscope.requests)
    load_model(source(), tmp_path)
    assert len(fake_modelscope.requests) == seen


def test_missing_repo_is_not_found(fake_modelscope: FakeModelScope, tmp_path: Path) -> None:
    with pytest.raises(LoadError) as caught:
        load_model(source("qwen/none"), tmp_path)
    assert caught.value.reason == "NotFound"
    assert "\n" not in caught.value.message


def test_rejected_token_is_unauthorized(
    fake_modelscope: FakeModelScope, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_modelscope.repos["qwen/tiny"] = FILES
    fake_modelscope.token = "ms-good"
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-bad")
    with pytest.raises(LoadError) as caught:
        load_model(source(), tmp_path)
    assert caught.value.reason == "Unauthorized"


def test_token_is_sent(
    fake_modelscope: FakeModelScope, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_modelscope.repos["qwen/tiny"] = FILES
    fake_modelscope.token = "ms-good"
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-good")
    assert (load_model(source(), tmp_path) / "config.json").read_bytes() == FILES["config.json"]


def test_patterns_matching_nothing_are_not_found(
    fake_modelscope: FakeModelScope, tmp_path: Path
) -> None:
    fake_modelscope.repos["qwen/tiny"] = FILES
    with pytest.raises(LoadError) as caught:
        load_model(source(allow_patterns=["*.gguf"]), tmp_path)
    assert caught.value.reason == "NotFound"
