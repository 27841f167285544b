"""S3 loading with real boto3 against moto's S3 server on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from llmplane.loader import LoadError, load_model, model_path
from tests.integration.loader_servers import MotoS3, moto_s3

__all__ = ["moto_s3"]

ROOT = Path(__file__).resolve().parents[2]
WEIGHTS = bytes(range(251)) * 8000  # ~2 MB, not a multiple of the 1 MiB read chunk
OBJECTS = {
    "tiny/model.gguf": WEIGHTS,
    "qwen/config.json": b'{"model_type": "qwen2"}',
    "qwen/model.safetensors": WEIGHTS[::-1],
    "qwen/sub/tokenizer.json": b"{}",
    "qwen-other/config.json": b"not part of qwen/",
}


@pytest.fixture
def bucket(moto_s3: MotoS3) -> Iterator[MotoS3]:
    client = boto3.client("s3")
    client.create_bucket(Bucket="models")
    for key, data in OBJECTS.items():
        client.put_object(Bucket="models", Key=key, Body=data)
    moto_s3.requests.clear()
    yield moto_s3


def test_single_object(bucket: MotoS3, tmp_path: Path) -> None:
    calls: list[tuple[int, int | None]] = []

    path = load_model("s3://models/tiny/model.gguf", tmp_path, lambda d, t: calls.append((d, t)))

    assert path == tmp_path / "s3" / "models" / "tiny" / "model.gguf"
    assert path == model_path("s3://models/tiny/model.gguf", tmp_path)
    assert path.read_bytes() == WEIGHTS
    assert (path.parent / ".model.gguf.llmplane-complete").exists()
    assert not list(path.parent.glob("*.part*"))
    assert calls[0] == (0, len(WEIGHTS)) and calls[-1] == (len(WEIGHTS), len(WEIGHTS))


def test_prefix_becomes_a_directory(bucket: MotoS3, tmp_path: Path) -> None:
    path = load_model("s3://models/qwen", tmp_path)

    assert path == tmp_path / "s3" / "models" / "qwen"
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    assert files == [".llmplane-complete", "config.json", "model.safetensors", "sub/tokenizer.json"]
    assert (path / "model.safetensors").read_bytes() == WEIGHTS[::-1]


def test_resumes_from_part_file_with_range(bucket: MotoS3, tmp_path: Path) -> None:
    target = model_path("s3://models/tiny/model.gguf", tmp_path)
    target.parent.mkdir(parents=True)
    etag = boto3.client("s3").head_object(Bucket="models", Key="tiny/model.gguf")["ETag"]
    Path(f"{target}.part").write_bytes(WEIGHTS[:400_000])
    Path(f"{target}.part.etag").write_text(etag)
    calls: list[tuple[int, int | None]] = []

    load_model("s3://models/tiny/model.gguf", tmp_path, lambda d, t: calls.append((d, t)))

    assert target.read_bytes() == WEIGHTS
    gets = bucket.gets("tiny/model.gguf")
    assert [g.headers.get("Range") for g in gets] == ["bytes=400000-"]
    assert [done for done, _ in calls[:2]] == [0, 400_000]  # kept bytes count as done at once
    assert not Path(f"{target}.part").exists() and not Path(f"{target}.part.etag").exists()


def test_part_file_of_another_version_is_discarded(bucket: MotoS3, tmp_path: Path) -> None:
    target = model_path("s3://models/tiny/model.gguf", tmp_path)
    target.parent.mkdir(parents=True)
    Path(f"{target}.part").write_bytes(b"x" * 400_000)
    Path(f"{target}.part.etag").write_text('"an-older-version"')

    load_model("s3://models/tiny/model.gguf", tmp_path)

    assert target.read_bytes() == WEIGHTS
    assert [g.headers.get("Range") for g in bucket.gets("tiny/model.gguf")] == [None]


def test_finished_prefix_files_are_kept(bucket: MotoS3, tmp_path: Path) -> None:
    # an earlier load got one file before it was interrupted (no completion marker yet)
    target = model_path("s3://models/qwen", tmp_path)
    (target / "sub").mkdir(parents=True)
    (target / "model.safetensors").write_bytes(WEIGHTS[::-1])

    load_model("s3://models/qwen", tmp_path)

    assert bucket.gets("qwen/model.safetensors") == []
    assert len(bucket.gets("qwen/config.json")) == 1


def test_finished_model_makes_no_requests(bucket: MotoS3, tmp_path: Path) -> None:
    load_model("s3://models/qwen", tmp_path)
    seen = len(bucket.requests)

    load_model("s3://models/qwen", tmp_path)

    assert len(bucket.requests) == seen


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("s3://models/missing.gguf", "no such object"),
        ("s3://models/qwe", "no such object"),  # a prefix of a key is not a directory
        ("s3://nobucket/model.gguf", "NoSuchBucket"),
    ],
)
def test_missing_is_not_found(bucket: MotoS3, tmp_path: Path, uri: str, words: str) -> None:
    with pytest.raises(LoadError) as caught:
        load_model(uri, tmp_path)
    assert caught.value.reason == "NotFound"
    assert words in caught.value.message


@pytest.fixture
def enforce_auth(bucket: MotoS3) -> Iterator[None]:
    """moto checks access keys against its IAM once INITIAL_NO_AUTH_ACTION_COUNT is reached."""

    def reset(count: str) -> None:
        request = urllib.request.Request(
            f"{bucket.url}/moto-api/reset-auth",
            data=count.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},  # a form body would leave request.data empty
        )
        urllib.request.urlopen(request).read()

    reset("0")
    yield
    reset("inf")


def test_unknown_access_key_is_unauthorized(enforce_auth: None, tmp_path: Path) -> None:
    with pytest.raises(LoadError) as caught:
        load_model("s3://models/tiny/model.gguf", tmp_path)
    assert caught.value.reason == "Unauthorized"
    assert "403" in caught.value.message or "InvalidAccessKeyId" in caught.value.message


def test_prefix_with_unknown_access_key_is_unauthorized(enforce_auth: None, tmp_path: Path) -> None:
    with pytest.raises(LoadError) as caught:
        load_model("s3://models/qwen", tmp_path)
    assert caught.value.reason == "Unauthorized"


def test_server_down_is_network_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")

    with pytest.raises(LoadError) as caught:
        load_model("s3://models/tiny/model.gguf", tmp_path)
    assert caught.value.reason == "NetworkError"


def test_s3_specific_endpoint_wins(
    bucket: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: nothing there
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", bucket.url)

    assert load_model("s3://models/tiny/model.gguf", tmp_path).read_bytes() == WEIGHTS


def test_concurrent_threads_download_once(bucket: MotoS3, tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def load() -> None:
        try:
            results.append(load_model("s3://models/qwen", tmp_path))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=load) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert not errors and len(results) == 8
    assert len(bucket.gets("qwen/model.safetensors")) == 1
    assert len(bucket.gets("qwen/config.json")) == 1


def test_concurrent_processes_download_once(bucket: MotoS3, tmp_path: Path) -> None:
    code = (
        "import sys; from llmplane.loader import load_model; "
        "print(load_model('s3://models/tiny/model.gguf', sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]

    assert all(p.returncode == 0 for p in procs)
    assert set(outputs) == {str(tmp_path / "s3" / "models" / "tiny" / "model.gguf")}
    assert len(bucket.gets("tiny/model.gguf")) == 1
