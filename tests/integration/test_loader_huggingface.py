"""Hugging Face loading through huggingface_hub's real download code against a local hub."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import pytest

from llmplane.api.llmaz import ModelHub, ModelSource
from llmplane.loader import LoadError, load_model, load_model_async, model_path
from tests.integration.loader_servers import FakeHub, fake_hub

__all__ = ["fake_hub"]

WEIGHTS = bytes(range(256)) * 4096  # 1 MiB
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": WEIGHTS,
    "README.md": b"# tiny\n",
    "onnx/model.onnx": b"onnx" * 100,
}


def hub_source(model_id: str = "org/tiny", **kwargs: object) -> ModelSource:
    return ModelSource(model_hub=ModelHub(model_id=model_id, **kwargs))


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int | None]] = []
        self.lock = threading.Lock()

    def __call__(self, done: int, total: int | None) -> None:
        with self.lock:
            self.calls.append((done, total))


def test_single_file_with_progress(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("org/tiny", FILES)
    source = hub_source(filename="model.safetensors")
    progress = Recorder()

    path = load_model(source, tmp_path, progress)

    assert (
        path == tmp_path / "models--org--tiny" / "model.safetensors" == model_path(source, tmp_path)
    )
    assert path.read_bytes() == WEIGHTS
    assert not (path.parent / "config.json").exists()
    assert progress.calls[-1] == (len(WEIGHTS), len(WEIGHTS))
    assert all(total in (None, len(WEIGHTS)) for _, total in progress.calls)
    assert [r.path for r in fake_hub.gets()] == ["/org/tiny/resolve/main/model.safetensors"]


def test_snapshot_with_patterns(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("org/tiny", FILES)
    source = hub_source(
        allow_patterns=["*.json", "*.safetensors", "onnx/*"], ignore_patterns=["onnx/*"]
    )
    progress = Recorder()

    path = load_model(source, tmp_path, progress)

    assert path == tmp_path / "models--org--tiny"
    files = sorted(
        str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and ".cache" not in p.parts
    )
    assert files == [".llmplane-complete", "config.json", "model.safetensors"]
    assert (path / "model.safetensors").read_bytes() == WEIGHTS
    size = len(WEIGHTS) + len(FILES["config.json"])
    assert progress.calls[-1] == (size, size)
    downloaded = {r.path for r in fake_hub.gets() if "/resolve/" in r.path}
    assert downloaded == {
        f"/org/tiny/resolve/{fake_hub.repos['org/tiny'].commit}/config.json",
        f"/org/tiny/resolve/{fake_hub.repos['org/tiny'].commit}/model.safetensors",
    }


def test_revision_is_passed_through(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("org/tiny", FILES, revisions={"v1.0": {"config.json": b'{"v": 1}'}})

    snapshot = load_model(hub_source(revision="v1.0"), tmp_path)
    single = load_model(hub_source(revision="v1.0", filename="config.json"), tmp_path)
    main = load_model(hub_source(filename="config.json"), tmp_path)

    assert snapshot == tmp_path / "models--org--tiny@v1.0"
    assert single == snapshot / "config.json"
    assert single.read_bytes() == b'{"v": 1}'
    assert main.read_bytes() == FILES["config.json"]
    paths = [r.path for r in fake_hub.requests]
    assert "/api/models/org/tiny/revision/v1.0" in paths
    assert "/org/tiny/resolve/v1.0/config.json" in paths


def test_token_is_sent(fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("org/private", FILES)
    fake_hub.token = "hf_secret"
    monkeypatch.setenv("HF_TOKEN", "hf_secret")

    load_model(hub_source("org/private", filename="config.json"), tmp_path)

    assert fake_hub.requests
    assert all(r.headers.get("Authorization") == "Bearer hf_secret" for r in fake_hub.requests)


@pytest.mark.parametrize("filename", ["config.json", None])
def test_bad_token_is_unauthorized(
    fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filename: str | None
) -> None:
    fake_hub.add_repo("org/private", FILES)
    fake_hub.token = "hf_secret"
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")

    with pytest.raises(LoadError) as caught:
        load_model(hub_source("org/private", filename=filename), tmp_path)

    assert caught.value.reason == "Unauthorized"
    assert "HF_TOKEN" in caught.value.message


def test_private_repo_without_token_is_not_found_with_hint(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    fake_hub.add_repo("org/private", FILES)
    fake_hub.token = "hf_secret"

    with pytest.raises(LoadError) as caught:
        load_model(hub_source("org/private"), tmp_path)

    assert caught.value.reason == "NotFound"
    assert "HF_TOKEN" in caught.value.message


@pytest.mark.parametrize(
    ("source", "words"),
    [
        (hub_source("org/tiny", filename="missing.bin"), "file 'missing.bin'"),
        (hub_source("org/nothing", filename="config.json"), "repository 'org/nothing'"),
        (hub_source("org/nothing"), "repository 'org/nothing'"),
        (hub_source("org/tiny", revision="v9"), "revision 'v9'"),
        (hub_source("org/tiny", revision="v9", filename="config.json"), "revision 'v9'"),
    ],
)
def test_missing_is_not_found(
    fake_hub: FakeHub, tmp_path: Path, source: ModelSource, words: str
) -> None:
    fake_hub.add_repo("org/tiny", FILES)

    with pytest.raises(LoadError) as caught:
        load_model(source, tmp_path)

    assert caught.value.reason == "NotFound"
    assert words in caught.value.message


@pytest.mark.parametrize(
    "filename",
    [
        None,
        # hf_hub_download retries the metadata request with backoff (about 23 s) before giving up
        pytest.param("config.json", marks=pytest.mark.slow),
    ],
)
def test_server_down_is_network_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filename: str | None
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")

    with pytest.raises(LoadError) as caught:
        load_model(hub_source(filename=filename), tmp_path)

    assert caught.value.reason == "NetworkError"
    assert not (tmp_path / "models--org--tiny" / ".llmplane-complete").exists()


def test_resumes_after_connection_drop(fake_hub: FakeHub, tmp_path: Path) -> None:
    # huggingface_hub reads the body in 10 MiB chunks and resumes after the last whole chunk,
    # so the connection breaks after 11 MiB of a 12 MiB file.
    big = WEIGHTS * 12
    fake_hub.add_repo("org/big", {"model.gguf": big})
    fake_hub.drop_once["model.gguf"] = 11 << 20
    progress = Recorder()

    path = load_model(hub_source("org/big", filename="model.gguf"), tmp_path, progress)

    assert path.read_bytes() == big
    gets = fake_hub.gets("model.gguf")
    assert len(gets) == 2
    assert "Range" not in gets[0].headers
    assert gets[1].headers["Range"] == f"bytes={10 << 20}-"
    assert progress.calls[-1] == (len(big), len(big))
    assert max(done for done, _ in progress.calls) == len(big)


def test_finished_model_is_not_checked_again(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("org/tiny", FILES)
    source = hub_source(allow_patterns=["*.json"])
    load_model(source, tmp_path)
    seen = len(fake_hub.requests)

    assert load_model(source, tmp_path) == tmp_path / "models--org--tiny"
    assert len(fake_hub.requests) == seen

    # another request on the same repo directory is loaded (and recorded) separately
    load_model(hub_source(filename="README.md"), tmp_path)
    assert len(fake_hub.requests) > seen
    assert (tmp_path / "models--org--tiny" / "README.md").exists()


def test_concurrent_loads_download_once(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("org/tiny", FILES)
    source = hub_source(filename="model.safetensors")
    results: list[Path] = []
    errors: list[BaseException] = []

    def load() -> None:
        try:
            results.append(load_model(source, tmp_path))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=load) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert not errors
    assert len(results) == 6 and len(set(results)) == 1
    assert len(fake_hub.gets("model.safetensors")) == 1


async def test_async_loads_share_one_download(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("org/tiny", FILES)
    source = hub_source(filename="model.safetensors")
    reports = [Recorder() for _ in range(5)]

    paths = await asyncio.gather(*(load_model_async(source, tmp_path, r) for r in reports))

    assert len(set(paths)) == 1 and paths[0].read_bytes() == WEIGHTS
    assert len(fake_hub.gets("model.safetensors")) == 1
    assert reports[0].calls[-1] == (len(WEIGHTS), len(WEIGHTS))


def test_patterns_matching_nothing_are_not_found(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("org/tiny", FILES)
    with pytest.raises(LoadError) as caught:
        load_model(hub_source(allow_patterns=["*.gguf"]), tmp_path)
    assert caught.value.reason == "NotFound"
    assert "allowPatterns ['*.gguf']" in caught.value.message
    assert not (tmp_path / "models--org--tiny" / ".llmplane-complete").exists()
