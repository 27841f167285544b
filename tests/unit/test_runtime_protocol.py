"""Both runtimes implement the ``Runtime`` protocol the controller is typed with."""

from __future__ import annotations

from pathlib import Path

from llmplane.runtime.base import Runtime
from llmplane.runtime.kube import KubeRuntime
from llmplane.runtime.local import LocalRuntime


def test_local_and_kube_runtimes_are_runtimes(tmp_path: Path) -> None:
    assert isinstance(LocalRuntime(tmp_path), Runtime)
    assert isinstance(KubeRuntime(client=None), Runtime)  # type: ignore[arg-type]
    assert not isinstance(object(), Runtime)
