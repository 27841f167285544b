"""Completion markers, the per-model lock, progress counting and error translation."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from llmplane.loader import cache
from llmplane.loader.errors import LoadError, causes
from llmplane.loader.progress import Progress


def test_marker_inside_a_directory_and_next_to_a_file(tmp_path: Path) -> None:
    directory = tmp_path / "models--org--m"
    directory.mkdir()
    single = tmp_path / "s3" / "b" / "m.gguf"
    single.parent.mkdir(parents=True)
    single.write_bytes(b"x")

    cache.mark_complete(directory, "file:a")
    cache.mark_complete(directory, "snapshot:{}")
    cache.mark_complete(single, "s3://b/m.gguf")

    assert (directory / ".llmplane-complete").exists()
    assert (single.parent / ".m.gguf.llmplane-complete").exists()
    assert cache.loaded_requests(directory) == ["file:a", "snapshot:{}"]
    assert cache.is_complete(single, "s3://b/m.gguf")
    assert not cache.is_complete(directory, "file:b")


def test_deleted_model_is_not_complete(tmp_path: Path) -> None:
    single = tmp_path / "m.gguf"
    single.write_bytes(b"x")
    cache.mark_complete(single, "r")
    single.unlink()
    assert not cache.is_complete(single, "r")  # the stale sibling marker does not count


def test_corrupt_marker_means_not_complete(tmp_path: Path) -> None:
    (tmp_path / ".llmplane-complete").write_text("{not json")
    assert not cache.is_complete(tmp_path, "r")
    cache.mark_complete(tmp_path, "r")
    assert cache.is_complete(tmp_path, "r")


def test_lock_is_exclusive_across_threads(tmp_path: Path) -> None:
    inside = 0
    most = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, most
        with cache.exclusive(tmp_path, "models--org--m"):
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.01)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1
    assert [p.name[:15] for p in (tmp_path / ".locks").iterdir()] == ["models--org--m-"]


def test_lock_file_names_stay_short(tmp_path: Path) -> None:
    name = "s3/bucket/" + "very-long-directory/" * 30 + "model.gguf"
    assert len(cache.lock_file(tmp_path, name).name) < 120


def test_progress_throttles_but_reports_the_end() -> None:
    calls: list[tuple[int, int | None]] = []
    progress = Progress(lambda d, t: calls.append((d, t)), interval=60)
    progress.set_total(100)
    for _ in range(10):
        progress.advance(10)
    assert calls == [(0, 100), (100, 100)]


def test_progress_unknown_total_finishes_at_done() -> None:
    calls: list[tuple[int, int | None]] = []
    progress = Progress(lambda d, t: calls.append((d, t)), interval=0)
    progress.advance(5)
    progress.finish()
    assert calls == [(5, None), (5, 5)]


def test_load_error_carries_reason_and_message() -> None:
    err = LoadError("NotFound", "no such bucket")
    assert (err.reason, err.message, str(err)) == (
        "NotFound",
        "no such bucket",
        "NotFound: no such bucket",
    )


def test_causes_follows_the_chain() -> None:
    try:
        try:
            raise ConnectionError("refused")
        except ConnectionError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert [type(e) for e in causes(outer)] == [RuntimeError, ConnectionError]


@pytest.mark.parametrize("status", [401, 403])
def test_huggingface_http_status_translation(status: int) -> None:
    httpx2 = pytest.importorskip("httpx2")
    errors = pytest.importorskip("huggingface_hub.errors")
    from llmplane.loader.huggingface import translate
    from llmplane.loader.locate import HubModel

    request = httpx2.Request("GET", "http://hub/org/m/resolve/main/x")
    response = httpx2.Response(status, request=request)
    err = errors.HfHubHTTPError("denied", response=response)
    translated = translate(err, HubModel("huggingface", "org/m"))
    assert translated.reason == "Unauthorized"


def test_failing_progress_callback_does_not_break_the_load() -> None:
    def broken(done: int, total: int | None) -> None:
        raise RuntimeError("display gone")

    progress = Progress(broken, interval=0)
    progress.set_total(10)
    progress.advance(10)  # no exception
    assert progress.done == 10


def test_unusable_cache_dir_is_a_load_error(tmp_path: Path) -> None:
    from llmplane.loader import load_model

    not_a_dir = tmp_path / "cache"
    not_a_dir.write_text("a file where the cache should be")
    with pytest.raises(LoadError) as caught:
        load_model("s3://bucket/model.gguf", not_a_dir)
    assert caught.value.reason == "DownloadFailed"
