"""GCS loading with the real google-cloud-storage client, pointed at a local server by
STORAGE_EMULATOR_HOST (the library's own emulator switch)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from llmplane.loader import LoadError, load_model, model_path
from tests.integration.loader_servers import FakeGCS, fake_gcs

__all__ = ["fake_gcs"]

WEIGHTS = bytes(range(241)) * 9000


@pytest.fixture
def gcs(fake_gcs: FakeGCS) -> FakeGCS:
    fake_gcs.buckets["models"] = {
        "tiny/model.gguf": WEIGHTS,
        "qwen/config.json": b"{}",
        "qwen/sub/model.safetensors": WEIGHTS[::-1],
    }
    return fake_gcs


def test_single_object(gcs: FakeGCS, tmp_path: Path) -> None:
    calls: list[tuple[int, int | None]] = []

    path = load_model("gcs://models/tiny/model.gguf", tmp_path, lambda d, t: calls.append((d, t)))

    assert path == tmp_path / "gcs" / "models" / "tiny" / "model.gguf"
    assert path.read_bytes() == WEIGHTS
    assert calls[-1] == (len(WEIGHTS), len(WEIGHTS))
    assert len(gcs.media_gets("tiny/model.gguf")) == 1


def test_prefix(gcs: FakeGCS, tmp_path: Path) -> None:
    path = load_model("gcs://models/qwen", tmp_path)

    assert path == model_path("gcs://models/qwen", tmp_path)
    assert (path / "sub" / "model.safetensors").read_bytes() == WEIGHTS[::-1]
    assert (path / "config.json").read_bytes() == b"{}"


def test_connection_drop_resumes_with_range(gcs: FakeGCS, tmp_path: Path) -> None:
    gcs.drop_once["tiny/model.gguf"] = 1_000_000

    path = load_model("gcs://models/tiny/model.gguf", tmp_path)

    assert path.read_bytes() == WEIGHTS
    gets = gcs.media_gets("tiny/model.gguf")
    assert len(gets) == 2
    ranges = [g.headers.get("Range") or g.headers.get("range") for g in gets]
    assert ranges[0] in (None, "bytes=0-")
    assert ranges[1] is not None and ranges[1].startswith("bytes=")
    assert 0 < int(ranges[1][len("bytes=") :].split("-")[0]) <= 1_000_000


def test_part_file_is_continued(gcs: FakeGCS, tmp_path: Path) -> None:
    target = model_path("gcs://models/tiny/model.gguf", tmp_path)
    target.parent.mkdir(parents=True)
    Path(f"{target}.part").write_bytes(WEIGHTS[:77_777])
    Path(f"{target}.part.etag").write_text("1")  # the generation the fake serves

    load_model("gcs://models/tiny/model.gguf", tmp_path)

    assert target.read_bytes() == WEIGHTS
    gets = gcs.media_gets("tiny/model.gguf")
    assert [(g.headers.get("Range") or g.headers.get("range")) for g in gets] == ["bytes=77777-"]


def test_rejected_credentials_are_unauthorized(gcs: FakeGCS, tmp_path: Path) -> None:
    gcs.deny = True
    with pytest.raises(LoadError) as caught:
        load_model("gcs://models/tiny/model.gguf", tmp_path)
    assert caught.value.reason == "Unauthorized"


@pytest.mark.parametrize("uri", ["gcs://models/missing.gguf", "gcs://nobucket/x.gguf"])
def test_missing_is_not_found(gcs: FakeGCS, tmp_path: Path, uri: str) -> None:
    with pytest.raises(LoadError) as caught:
        load_model(uri, tmp_path)
    assert caught.value.reason == "NotFound"


def test_server_down_is_network_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    with pytest.raises(LoadError) as caught:
        load_model("gcs://models/tiny/model.gguf", tmp_path)
    assert caught.value.reason == "NetworkError"
