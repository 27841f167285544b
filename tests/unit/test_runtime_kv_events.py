"""Where a local engine publishes its KV events (``runtime/launch.kv_events_argv``)."""

from __future__ import annotations

import json
from pathlib import Path

from llmplane.runtime.endpoint import pod_kv_events
from llmplane.runtime.launch import kv_events_argv, kv_socket_dir


def test_vllm_and_the_sim_get_ipc_sockets_in_the_state_directory(tmp_path: Path) -> None:
    sockets = kv_socket_dir(Path("/tmp") / tmp_path.name)
    assert sockets is not None and sockets.is_dir()
    for engine in ("vllm", "sim"):
        argv, events, replay = kv_events_argv(["serve", "--port", "1"], engine, sockets, "a-b-0")
        config = json.loads(argv[argv.index("--kv-events-config") + 1])
        assert config["enable_kv_cache_events"] and config["publisher"] == "zmq"
        assert config["endpoint"] == events == f"ipc://{sockets}/a-b-0.sock"
        assert config["replay_endpoint"] == replay == f"ipc://{sockets}/a-b-0-replay.sock"
    assert kv_events_argv(["serve"], "llamacpp", sockets, "x") == (["serve"], "", "")


def test_a_long_state_directory_gets_a_short_private_one(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90)
    sockets = kv_socket_dir(deep)
    assert sockets is not None and len(str(sockets)) < 60
    assert sockets.stat().st_mode & 0o777 == 0o700
    assert kv_socket_dir(deep) == sockets  # the same for the same state directory


def test_a_command_that_sets_the_flag_keeps_it_and_is_read() -> None:
    own = json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
         "replay_endpoint": "tcp://*:5558"}
    )  # fmt: skip
    argv = ["serve", "--kv-events-config", own]
    assert kv_events_argv(argv, "vllm", Path("/x"), "n") == (
        argv,
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:5558",
    )
    connects = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                           "endpoint": "tcp://collector:5557"})  # fmt: skip
    assert kv_events_argv([f"--kv-events-config={connects}"], "vllm", Path("/x"), "n")[1:] == (
        "",
        "",
    )
    for off in ('{"enable_kv_cache_events": false}', "not json", '{"publisher": "null"}'):
        assert kv_events_argv(["--kv-events-config", off], "vllm", Path("/x"), "n")[1:] == ("", "")
    assert kv_events_argv(["--kv-events-config"], "vllm", Path("/x"), "n")[1:] == ("", "")


def test_a_pod_publishing_on_a_tcp_port_is_subscribed_at_its_ip() -> None:
    config = json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
         "replay_endpoint": "tcp://*:5558", "topic": "kv"}
    )  # fmt: skip
    pod = {"spec": {"containers": [{"name": "sidecar", "args": ["x"]},
                                   {"command": ["vllm"], "args": ["--kv-events-config", config]}]}}  # fmt: skip
    assert pod_kv_events(pod, "10.0.0.7") == ("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558")
    ipc = config.replace("tcp://*:5557", "ipc:///tmp/kv.sock")  # not reachable from another pod
    pod["spec"]["containers"][1]["args"][1] = ipc
    assert pod_kv_events(pod, "10.0.0.7") == ("", "")
    assert pod_kv_events({"spec": {"containers": "bad"}}, "10.0.0.7") == ("", "")
