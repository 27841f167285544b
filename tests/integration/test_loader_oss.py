"""OSS loading with the real oss2 client against a local server speaking OSS's object API."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from llmplane.loader import LoadError, load_model, model_path
from tests.integration.loader_servers import FakeOSS, fake_oss

__all__ = ["fake_oss"]

WEIGHTS = bytes(range(253)) * 9000


@pytest.fixture
def oss(fake_oss: FakeOSS) -> FakeOSS:
    fake_oss.buckets["models"] = {
        "tiny/model.gguf": WEIGHTS,
        "qwen/config.json": b"{}",
        "qwen/model.safetensors": WEIGHTS[::-1],
    }
    return fake_oss


def uri(oss: FakeOSS, path: str, bucket: str = "models") -> str:
    return f"oss://{bucket}.127.0.0.1:{oss.server.port}/{path}"


def test_single_object(oss: FakeOSS, tmp_path: Path) -> None:
    calls: list[tuple[int, int | None]] = []

    path = load_model(uri(oss, "tiny/model.gguf"), tmp_path, lambda d, t: calls.append((d, t)))

    assert path == tmp_path / "oss" / "models" / "tiny" / "model.gguf"
    assert path.read_bytes() == WEIGHTS
    assert calls[-1] == (len(WEIGHTS), len(WEIGHTS))
    assert oss.gets("tiny/model.gguf")[0].path == "/models/tiny/model.gguf"  # path style


def test_prefix(oss: FakeOSS, tmp_path: Path) -> None:
    path = load_model(uri(oss, "qwen/"), tmp_path)

    assert path == model_path(uri(oss, "qwen"), tmp_path)
    assert (path / "model.safetensors").read_bytes() == WEIGHTS[::-1]
    assert (path / "config.json").read_bytes() == b"{}"


def test_connection_drop_resumes_with_range(oss: FakeOSS, tmp_path: Path) -> None:
    oss.drop_once["tiny/model.gguf"] = 1_500_000

    path = load_model(uri(oss, "tiny/model.gguf"), tmp_path)

    assert path.read_bytes() == WEIGHTS
    gets = oss.gets("tiny/model.gguf")
    assert len(gets) == 2
    assert "Range" not in gets[0].headers
    assert gets[1].headers["Range"].startswith("bytes=")
    resumed_at = int(gets[1].headers["Range"][len("bytes=") :].rstrip("-"))
    assert 0 < resumed_at <= 1_500_000


def test_part_file_is_continued(oss: FakeOSS, tmp_path: Path) -> None:
    target = model_path(uri(oss, "tiny/model.gguf"), tmp_path)
    target.parent.mkdir(parents=True)
    import hashlib

    Path(f"{target}.part").write_bytes(WEIGHTS[:123_456])
    Path(f"{target}.part.etag").write_text(hashlib.md5(WEIGHTS).hexdigest().upper())

    load_model(uri(oss, "tiny/model.gguf"), tmp_path)

    assert target.read_bytes() == WEIGHTS
    assert [g.headers.get("Range") for g in oss.gets("tiny/model.gguf")] == ["bytes=123456-"]


def test_credentials_are_used_and_wrong_ones_rejected(
    oss: FakeOSS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    oss.access_key_id = "LTAIgood"
    monkeypatch.setenv("OSS_ACCESS_KEY_ID", "LTAIgood")
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", "secret")
    assert load_model(uri(oss, "qwen/config.json"), tmp_path).read_bytes() == b"{}"

    monkeypatch.setenv("OSS_ACCESS_KEY_ID", "LTAIbad")
    with pytest.raises(LoadError) as caught:
        load_model(uri(oss, "tiny/model.gguf"), tmp_path)
    assert caught.value.reason == "Unauthorized"


@pytest.mark.parametrize(
    ("path", "bucket", "words"),
    [("missing.gguf", "models", "no such object"), ("x.gguf", "nobucket", "NoSuchBucket")],
)
def test_missing_is_not_found(
    oss: FakeOSS, tmp_path: Path, path: str, bucket: str, words: str
) -> None:
    with pytest.raises(LoadError) as caught:
        load_model(uri(oss, path, bucket), tmp_path)
    assert caught.value.reason == "NotFound"
    assert words in caught.value.message


def test_server_down_is_network_error(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(LoadError) as caught:
        load_model(f"oss://models.127.0.0.1:{port}/tiny/model.gguf", tmp_path)
    assert caught.value.reason == "NetworkError"


def test_server_ignoring_range_still_gives_the_right_bytes(oss: FakeOSS, tmp_path: Path) -> None:
    import hashlib

    oss.ignore_range = True
    target = model_path(uri(oss, "tiny/model.gguf"), tmp_path)
    target.parent.mkdir(parents=True)
    Path(f"{target}.part").write_bytes(WEIGHTS[:100_000])
    Path(f"{target}.part.etag").write_text(hashlib.md5(WEIGHTS).hexdigest().upper())

    assert load_model(uri(oss, "tiny/model.gguf"), tmp_path).read_bytes() == WEIGHTS
