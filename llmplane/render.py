"""``llmplane render -f FILE|DIR``: the Kubernetes objects the operator would create, as YAML.

Like ``helm template``: nothing is contacted. Playgrounds become inference Services (and HPAs),
Services become LeaderWorkerSets (or Deployments with ``--deployment``) and ``<name>-lb``
Services. BackendRuntimes not defined in the files come from the built-ins. ``--crds`` prints the
CustomResourceDefinitions first. Owner references need the owner's uid, which only the API
server assigns, so rendered objects have none; the operator adds them.

Exit codes: 0 rendered, 1 a resource cannot be planned, 2 invalid input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from llmplane.api.documents import InvalidResources, parse_paths, parse_text
from llmplane.api.inference import BackendRuntime
from llmplane.controlplane.planning import PlanningError
from llmplane.runtime.kube import DEFAULT_IMAGE, KubeOptions, objects_for


def builtin_backend_models() -> list[BackendRuntime]:
    from llmplane.up import builtin_backends

    docs = builtin_backends()
    text = yaml.safe_dump_all(docs)
    return [r for r in parse_text(text, "builtin").resources if isinstance(r, BackendRuntime)]


def render_objects(
    paths: Sequence[str], options: KubeOptions | None = None
) -> list[dict[str, Any]]:
    """Parse ``paths`` and return every object (raises InvalidResources / PlanningError)."""
    parsed = parse_paths(paths)
    return objects_for(parsed.resources, builtin_backend_models(), options)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (shell scripts) as literal blocks, keys in insertion order."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(objects: Sequence[dict[str, Any]], out: TextIO) -> None:
    out.write(yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False, explicit_start=True))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmplane render",
        description="Print the Kubernetes objects the operator would create for these resources.",
    )
    p.add_argument(
        "-f", "--filename", action="append", required=True, help="YAML file or directory"
    )
    p.add_argument("--crds", action="store_true", help="print the CRDs first")
    p.add_argument(
        "--deployment",
        action="store_true",
        help="apps/v1 Deployments instead of LeaderWorkerSets (single-host only)",
    )
    p.add_argument("--image", default=DEFAULT_IMAGE, help="llmplane image for model loaders")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    options = KubeOptions(image=args.image, use_leader_worker_set=not args.deployment)
    try:
        objects = render_objects(args.filename, options)
    except InvalidResources as err:
        for message in err.messages:
            print(f"error: {message}", file=sys.stderr)
        return 2
    except PlanningError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.crds:
        from llmplane.api.crds import crd_documents

        objects = [*crd_documents(), *objects]
    dump_yaml(objects, sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
