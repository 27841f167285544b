"""Local runtime building blocks: argv rewriting, engine checks, ports, metrics, probe timing."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import pytest

from llmplane.controlplane.plan import HttpProbe
from llmplane.runtime.launch import (
    engine_argv,
    free_port,
    missing_engine,
    module_exists,
    python_module,
    rewrite_argv,
)
from llmplane.runtime.probes import parse_running_requests, schedule


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # vLLM style: both flags, separate values
        (
            ["vllm", "serve", "m", "--port", "8080", "--host", "0.0.0.0"],
            ["vllm", "serve", "m", "--port", "4321", "--host", "127.0.0.1"],
        ),
        # = forms
        (
            ["python3", "-m", "sglang.launch_server", "--port=8080", "--host=0.0.0.0"],
            ["python3", "-m", "sglang.launch_server", "--port=4321", "--host=127.0.0.1"],
        ),
        # TGI names its host flag --hostname
        (
            [
                "text-generation-launcher",
                "--model-id",
                "m",
                "--hostname",
                "0.0.0.0",
                "--port",
                "8080",
            ],
            [
                "text-generation-launcher",
                "--model-id",
                "m",
                "--hostname",
                "127.0.0.1",
                "--port",
                "4321",
            ],
        ),
        (
            ["text-generation-launcher", "--hostname=0.0.0.0"],
            ["text-generation-launcher", "--hostname=127.0.0.1", "--port", "4321"],
        ),
        # no --port: both appended
        (
            ["llama-server", "-m", "x.gguf"],
            ["llama-server", "-m", "x.gguf", "--port", "4321", "--host", "127.0.0.1"],
        ),
        # --host but no --port: only the port appended
        (["e", "--host", "::"], ["e", "--host", "127.0.0.1", "--port", "4321"]),
        # --port but no host flag: left alone (an engine's own flag we do not know)
        (
            ["e", "--port", "8080", "--bind", "0.0.0.0"],
            ["e", "--port", "4321", "--bind", "0.0.0.0"],
        ),
        # a trailing flag without a value still gets one
        (["e", "--port"], ["e", "--port", "4321"]),
        # prefixes argparse accepts are the flag itself (issue 27: --hos 0.0.0.0, --ho=0.0.0.0)
        (
            ["e", "--hos", "0.0.0.0", "--po=1"],
            ["e", "--host", "127.0.0.1", "--port=4321"],
        ),
        (["e", "--ho=::", "--p", "9"], ["e", "--host=127.0.0.1", "--port", "4321"]),
        (["e", "--h", "0.0.0.0"], ["e", "--host", "127.0.0.1", "--port", "4321"]),
        (
            ["e", "--hostn", "0.0.0.0", "--por", "1"],
            ["e", "--hostname", "127.0.0.1", "--port", "4321"],
        ),
        (
            ["e", "--port", "1", "--hostnam=0.0.0.0", "--host", "::"],
            ["e", "--port", "4321", "--hostname=127.0.0.1", "--host", "127.0.0.1"],
        ),
        # look-alikes are not touched
        (
            ["e", "--portal", "1", "--hosts=a", "--port", "1"],
            ["e", "--portal", "1", "--hosts=a", "--port", "4321"],
        ),
    ],
)
def test_rewrite_argv(argv: list[str], expected: list[str]) -> None:
    assert rewrite_argv(argv, 4321) == expected


def test_rewrite_argv_does_not_modify_the_plan() -> None:
    argv = ["e", "--port", "1"]
    rewrite_argv(argv, 2)
    assert argv == ["e", "--port", "1"]


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        (
            ["python", "-m", "vllm.entrypoints.openai.api_server", "--port", "1"],
            "vllm.entrypoints.openai.api_server",
        ),
        (["python3", "-u", "-m", "llama_cpp.server"], "llama_cpp.server"),
        (["/usr/bin/python3.11", "-mfoo"], "foo"),
        ([sys.executable, "-m", "bar"], "bar"),
        (["python", "script.py", "-m", "x"], None),
        (["python", "-c", "code", "-m", "x"], None),
        (["vllm", "-m", "x"], None),
        ([], None),
    ],
)
def test_python_module(argv: list[str], module: str | None) -> None:
    assert python_module(argv) == module


def test_module_exists_without_importing() -> None:
    assert module_exists("json")
    assert module_exists("email.mime.text")
    assert module_exists("http.server")
    assert not module_exists("not_installed_module")
    assert not module_exists("json.not_a_submodule")
    assert not module_exists("json.decoder.deeper")  # a module, not a package
    before = set(sys.modules)
    assert module_exists("xmlrpc.server")
    assert "xmlrpc.server" not in set(sys.modules) - before


async def test_missing_engine() -> None:
    env = dict(os.environ)
    assert await missing_engine([sys.executable, "-m", "json.tool"], env) is None
    assert await missing_engine([sys.executable, "some_script.py"], env) is None
    why = await missing_engine([sys.executable, "-m", "not_installed_module"], env)
    assert why is not None and "'not_installed_module' is not installed" in why
    why = await missing_engine(["no-such-engine-x1", "serve"], env)
    assert why is not None and "'no-such-engine-x1' not found on PATH" in why
    assert await missing_engine([], env) == "the local command is empty"


async def test_missing_engine_asks_another_interpreter(tmp_path) -> None:
    # A plan that changes PYTHONPATH is checked by a child interpreter with that environment.
    (tmp_path / "only_here.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    assert await missing_engine([sys.executable, "-m", "only_here"], env) is None
    assert await missing_engine([sys.executable, "-m", "only_here"], dict(os.environ)) is not None
    assert await missing_engine([sys.executable, "-m", "only_there"], env) is not None


def test_free_port() -> None:
    port = free_port()
    assert 0 < port < 65536
    assert free_port(port) == port  # still free: kept across restarts
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert free_port(port) != port  # taken: another one


def test_parse_running_requests() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests running\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a"} 2.0\n'
        'vllm:num_requests_running{model_name="b",x="}"} 1.0 1700000000\n'
        "vllm:num_requests_running_total 99\n"
        "vllm:num_requests_waiting 7\n"
    )
    assert parse_running_requests(text) == 3
    assert parse_running_requests("sglang:num_running_reqs 4\n") == 4
    assert parse_running_requests("vllm:num_requests_running 0\n") == 0
    assert parse_running_requests("other_metric 1\n") is None


async def test_probe_schedule_honours_initial_delay_and_period() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    # Kubernetes' whole seconds scaled down: the same code with floats.
    probe = HttpProbe(path="/", port=1, initial_delay_seconds=0.2, period_seconds=0.1)  # type: ignore[arg-type]
    times = []
    async for _ in schedule(probe, start, start):
        times.append(loop.time() - start)
        if len(times) == 3:
            break
    assert times[0] == pytest.approx(0.2, abs=0.05)
    assert times[1] == pytest.approx(0.3, abs=0.05)
    assert times[2] == pytest.approx(0.4, abs=0.05)

    # Readiness waits for the startup probe: not before `not_before`.
    times.clear()
    start = loop.time()
    async for _ in schedule(probe, start - 5, start + 0.1):
        times.append(loop.time() - start)
        break
    assert times[0] == pytest.approx(0.1, abs=0.05)


async def test_probe_schedule_hurries_between_ticks_without_counting_them() -> None:
    loop = asyncio.get_running_loop()
    probe = HttpProbe(path="/", port=1, period_seconds=0.5)  # type: ignore[arg-type]
    start = loop.time()
    seen: list[bool] = []
    async for counted in schedule(probe, start, start, hurry=lambda: True, fast=0.05):
        seen.append(counted)
        if counted and loop.time() - start > 0.4:
            break
    assert seen[0] is True and seen[-1] is True and seen.count(True) == 2
    assert seen.count(False) >= 4  # the extra attempts in between

    hurry = False
    seen.clear()
    start = loop.time()
    async for counted in schedule(probe, start, start, hurry=lambda: hurry, fast=0.05):
        seen.append(counted)
        if len(seen) == 2:
            break
    assert seen == [True, True]  # not hurried: only the probe's own ticks


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "-m", "llmplane.sim"], [sys.executable, "-m", "llmplane.sim"]),
        (
            ["python3", "-m", "vllm.entrypoints.openai.api_server"],
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server"],
        ),
        # a named interpreter is the BackendRuntime's choice
        (["/opt/venv/bin/python", "-m", "vllm"], ["/opt/venv/bin/python", "-m", "vllm"]),
        (
            ["python3.12", "-m", "sglang.launch_server"],
            ["python3.12", "-m", "sglang.launch_server"],
        ),
        (["llama-server", "-m", "python"], ["llama-server", "-m", "python"]),
        ([], []),
    ],
)
def test_engine_argv_runs_python_engines_with_llmplanes_interpreter(argv, expected) -> None:
    assert engine_argv(argv) == expected
