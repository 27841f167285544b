"""The gateway's own shortage (out of descriptors or memory while connecting upstream) is a
local failure: never charged to the replica (outlier ejection), logged once per burst. The
EMFILE is a real one: this process's soft open-files limit is lowered until asyncio's
``create_connection`` cannot get a socket."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket

import pytest

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.observability import Counter
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.pd import PrefillFailed
from llmplane.gateway.proxy import AttemptFailed, attempt_failure
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.upstream_client import ServerDisconnected
from llmplane.runtime.endpoint import Endpoint

CONFIG = GatewayConfig(ejection_failures=3, ejection_base=10.0, ejection_max=35.0)


def real_emfile() -> OSError:
    """What ``loop.create_connection`` raises when this process has no descriptor left."""
    listener = socket.create_server(("127.0.0.1", 0))
    loop = asyncio.new_event_loop()  # its selector and self-pipe before the shortage
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []

    async def connect() -> None:
        await asyncio.get_running_loop().create_connection(
            asyncio.Protocol, "127.0.0.1", listener.getsockname()[1]
        )

    try:
        top = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 8, hard))
        with pytest.raises(OSError) as filled:
            while True:
                held.append(os.dup(0))
        assert filled.value.errno == errno.EMFILE
        with pytest.raises(OSError) as raised:
            loop.run_until_complete(connect())
        return raised.value
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        loop.close()
        listener.close()


def test_a_real_emfile_connecting_upstream_is_a_local_failure() -> None:
    # asyncio's loop (the gateway runs on uvloop: its EMFILE is in the integration test)
    err = real_emfile()
    assert err.errno == errno.EMFILE, err
    failure = attempt_failure(err, 5.0)
    assert failure.kind == "local" and not failure.blames_replica
    assert "Too many open files" in failure.detail
    assert isinstance(attempt_failure(err, 5.0, PrefillFailed), PrefillFailed)


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM])
def test_every_own_shortage_is_local(code: int) -> None:
    failure = attempt_failure(OSError(code, os.strerror(code)), 5.0)
    assert failure.kind == "local" and not failure.blames_replica


@pytest.mark.parametrize(
    "err",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        ServerDisconnected("closed"),
        OSError(errno.EHOSTUNREACH, "No route to host"),
        OSError("Multiple exceptions: ..."),
        TimeoutError(),
    ],
)
def test_the_replicas_own_failures_still_blame_it(err: BaseException) -> None:
    failure = attempt_failure(err, 5.0)
    assert failure.kind != "local" and failure.blames_replica


def test_local_failures_never_eject_and_are_logged_once_per_burst(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ejections = Counter("ejections", "", ["endpoint"])
    outliers = Outliers(CONFIG, ejections)

    def ejected() -> list[str]:
        return [a for (a,), child in ejections.children.items() for _ in range(int(child.value))]

    s = EndpointState(Endpoint("10.0.0.1:8000", engine="vllm"))
    local = attempt_failure(real_emfile(), 5.0)
    with caplog.at_level(logging.INFO, logger="llmplane.gateway"):
        for _ in range(50):
            outliers.attempt_failed(s, local)
        assert s.consecutive_failures == 0 and s.ejected_until == 0.0 and ejected() == []
        shortage = [r for r in caplog.records if "ran out of its own resources" in r.message]
        assert len(shortage) == 1 and "Too many open files" in shortage[0].message
        outliers.success(s)
        outliers.success(s)
        assert sum("has its resources back" in r.message for r in caplog.records) == 1
        for _ in range(3):  # the replica's own failures still count
            outliers.attempt_failed(s, AttemptFailed("connect", "refused"))
        assert ejected() == [s.address]
