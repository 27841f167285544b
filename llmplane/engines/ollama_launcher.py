"""Run the ollama BackendRuntime's shell script on a port the local runtime chose.

ollama takes its address from ``OLLAMA_HOST``, not from flags, so the local runtime's
``--port N --host H`` (appended to every local command) become that variable here. Exits with
127, the shell's "command not found", when ollama is not installed, which the runtime reports
as EngineNotInstalled instead of restarting.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ollama_launcher", description=__doc__)
    parser.add_argument("script", help="the shell script to run (the recommended config's args)")
    parser.add_argument("--port", type=int, default=11434)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    if shutil.which("ollama") is None:
        print("ollama is not installed: https://ollama.com/download", file=sys.stderr)
        return 127
    os.environ["OLLAMA_HOST"] = f"{args.host}:{args.port}"
    os.execvp("sh", ["sh", "-c", args.script])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
