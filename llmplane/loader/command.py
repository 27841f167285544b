"""``llmplane load-model``: make one model present in a cache directory, with a progress bar.

Used by people (``llmplane load-model --hub Huggingface --model-id Qwen/Qwen2-0.5B-Instruct``) and
as the Kubernetes init container (``--cache-dir /workspace/models``). Prints the model path on
stdout; progress and errors go to stderr. Exit codes: 0 loaded, 1 LoadError (one line, no
traceback), 2 bad arguments, 130 interrupted (a later run resumes).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from llmplane.api.llmaz import ModelHub, ModelSource
from llmplane.loader.errors import LoadError
from llmplane.loader.load import load_model
from llmplane.loader.progress import ProgressFn


def default_cache_dir() -> Path:
    """``<state dir>/models`` (``$LLMPLANE_HOME`` or ``~/.llmplane``)."""
    from llmplane.store.paths import state_dir

    return state_dir() / "models"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmplane load-model",
        description="Download a model into the model cache (once, resumably) and print its path.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--uri", help="host://, ollama://, oss://, s3://, gcs:// or package:// URI")
    where.add_argument("--model-id", help="hub model id, e.g. Qwen/Qwen2-0.5B-Instruct")
    p.add_argument("--hub", choices=["Huggingface", "ModelScope"], default="Huggingface")
    p.add_argument("--filename", help="one file of the repo instead of a snapshot")
    p.add_argument("--revision", default="main", help="branch, tag or commit (default: main)")
    p.add_argument("--allow-pattern", action="append", dest="allow_patterns", metavar="GLOB")
    p.add_argument("--ignore-pattern", action="append", dest="ignore_patterns", metavar="GLOB")
    p.add_argument("--cache-dir", type=Path, help="cache directory (default: <state dir>/models)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def source_from(args: argparse.Namespace) -> ModelSource:
    if args.uri is not None:
        hub_only = [
            flag
            for flag, value in (
                ("--filename", args.filename),
                ("--allow-pattern", args.allow_patterns),
                ("--ignore-pattern", args.ignore_patterns),
            )
            if value
        ]
        if hub_only:
            raise ValueError(f"{', '.join(hub_only)} only apply to --model-id")
        return ModelSource(uri=args.uri)
    return ModelSource(
        model_hub=ModelHub(
            name=args.hub,
            model_id=args.model_id,
            filename=args.filename,
            revision=args.revision,
            allow_patterns=args.allow_patterns,
            ignore_patterns=args.ignore_patterns,
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    err = Console(stderr=True, highlight=False)
    try:
        source = source_from(args)
    except ValueError as error:
        err.print(f"error: {error}", markup=False)
        return 2
    problems = source.violations("source")
    if problems:
        err.print("error: " + "; ".join(str(v) for v in problems), markup=False)
        return 2
    return run(source, args.cache_dir or default_cache_dir(), quiet=args.quiet, console=err)


def run(
    source: ModelSource, cache_dir: Path, *, quiet: bool = False, console: Console | None = None
) -> int:
    """Load ``source`` showing progress on ``console`` (stderr); the path goes to stdout."""
    err = console or Console(stderr=True, highlight=False)
    try:
        if quiet:
            path = load_model(source, cache_dir)
        elif err.is_terminal:
            path = _with_bar(source, cache_dir, err)
        else:
            path = load_model(source, cache_dir, _log_lines(err))
    except LoadError as error:
        err.print(f"error: {error.reason}: {error.message}", markup=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted: the next load resumes where this one stopped", markup=False)
        return 130
    print(path)
    return 0


def _with_bar(source: ModelSource, cache_dir: Path, console: Console) -> Path:
    columns = (
        TextColumn("[bold]loading"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("model", total=None)

        def update(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        return load_model(source, cache_dir, update)


def _log_lines(console: Console, every: float = 5.0) -> ProgressFn:
    """Progress for logs (init containers): a line every ``every`` seconds and at the end."""
    last = [0.0]

    def report(done: int, total: int | None) -> None:
        now = time.monotonic()
        finished = total is not None and done >= total
        if not finished and now - last[0] < every:
            return
        last[0] = now
        if total:
            console.print(f"loaded {_size(done)} of {_size(total)} ({100 * done // total}%)")
        else:
            console.print(f"loaded {_size(done)}")

    return report


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1000
    return f"{value:.1f} TB"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
