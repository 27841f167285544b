"""The ``llmplane`` command: kubectl-like resource commands plus the embedded platform.

User mistakes (invalid YAML, unknown kinds, missing objects) print a message and exit 1;
tracebacks are for bugs only.

Over 500 lines on purpose: it is only the typer app, one short function per command (argument
parsing, calling the module that does the work, printing), and typer wants them on one ``app``;
the work itself is in ``store/``, ``up.py``, ``printing.py`` and the subcommands' own modules.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llmplane.api.base import Resource
from llmplane.api.documents import (
    InvalidResources,
    Parsed,
    parse_paths,
    parse_text,
    stored_form,
)
from llmplane.api.registry import KINDS, in_version, resolve_kind
from llmplane.printing import age, cell, jsonpath, to_yaml

if TYPE_CHECKING:
    from llmplane.store.base import Store

app = typer.Typer(
    name="llmplane",
    help="Declare LLMs in YAML, run their model servers, route OpenAI traffic to the best replica.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Piped output is not cut to 80 columns (tables stay parseable by scripts).
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 250)
err = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])

StateDir = Annotated[
    Path | None,
    typer.Option("--state-dir", help="State directory (default: $LLMPLANE_HOME or ~/.llmplane)."),
]
Files = Annotated[
    list[str],
    typer.Option("-f", "--filename", help="File or directory of YAML/JSON; '-' reads stdin."),
]
Namespace = Annotated[str | None, typer.Option("-n", "--namespace", help="Namespace.")]


class UserError(Exception):
    """A mistake the user can fix; printed without a traceback."""


def fail(message: str) -> None:
    raise UserError(message)


def _store(state_dir: Path | None) -> Store:
    from llmplane.store.paths import open_store

    return open_store(state_dir)


def _read(files: list[str]) -> Parsed:
    if not files:
        fail("no input: pass -f FILE, -f DIR or -f - (stdin)")
    parsed = Parsed()
    paths = [f for f in files if f != "-"]
    if len(paths) != len(files):
        one = parse_text(sys.stdin.read(), "<stdin>")
        parsed.resources += one.resources
        parsed.warnings += one.warnings
    if paths:
        missing = [p for p in paths if not Path(p).exists()]
        if missing:
            fail("; ".join(f"{p}: no such file or directory" for p in missing))
        many = parse_paths(paths)
        parsed.resources += many.resources
        parsed.warnings += many.warnings
    if not parsed.resources:
        fail("no resources found in " + ", ".join(files))
    return parsed


def _check_capacity(resources: list[Resource]) -> None:
    """What the embedded runtime cannot run is refused before anything is stored (the
    replica ceiling, llmplane/runtime/capacity.py; Kubernetes has no such ceiling)."""
    from llmplane.runtime import capacity

    problems = capacity.check(resources)
    if problems:
        raise InvalidResources(problems)


def _warn(warnings: list[str]) -> None:
    for w in warnings:
        err.print(f"[yellow]Warning:[/] {w}")


def _type_name(cls: type[Resource]) -> str:
    return f"{cls.plural[:-1] if cls.plural.endswith('s') else cls.plural}.{cls.group}"


@app.command()
def validate(files: Files) -> None:
    """Check files without storing anything: every mistake, with its field path and rule."""
    parsed = _read(files)
    _warn(parsed.warnings)
    for r in parsed.resources:
        out.print(f"{r.ref} valid")


@app.command()
def apply(
    files: Files,
    state_dir: StateDir = None,
    force_conflicts: Annotated[
        bool,
        typer.Option(
            "--force-conflicts",
            help="Let the files replace fields llmplane's commands write (a Tenant's keys): "
            "without it, fields a file leaves out are kept and dropping or changing them is "
            "refused.",
        ),
    ] = False,
) -> None:
    """Create or update resources. If any document is invalid, nothing is stored."""
    parsed = _read(files)
    _warn(parsed.warnings)
    _check_capacity(parsed.resources)
    store = _store(state_dir)
    docs = [stored_form(r) for r in parsed.resources]
    before = [_get_or_none(store, d) for d in docs]
    after = store.apply_many(docs, force_conflicts=force_conflicts)
    for old, new, r in zip(before, after, parsed.resources, strict=True):
        if old is None:
            verb = "created"
        elif old["metadata"]["resourceVersion"] == new["metadata"]["resourceVersion"]:
            verb = "unchanged"
        else:
            verb = "configured"
        out.print(f"{_type_name(type(r))}/{r.name} {verb}")


def _get_or_none(store: Store, doc: dict[str, Any]) -> dict[str, Any] | None:
    """The stored version of ``doc``; a corrupt row counts as none (applying replaces it)."""
    from llmplane.store.base import CorruptObject

    try:
        return store.get(doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace"))
    except CorruptObject:
        return None


def _kind(kind: str) -> type[Resource]:
    try:
        return resolve_kind(kind)
    except KeyError as e:
        fail(str(e.args[0]))
        raise  # unreachable


def _ns(cls: type[Resource], namespace: str | None, all_namespaces: bool = False) -> str | None:
    if not cls.namespaced or all_namespaces:
        return None
    return namespace or "default"


@app.command()
def get(
    kind: Annotated[str, typer.Argument(help="Kind, plural or short name (pl, om, br, ...).")],
    name: Annotated[str | None, typer.Argument()] = None,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="yaml, json, wide or name.")
    ] = None,
    selector: Annotated[
        str | None, typer.Option("-l", "--selector", help="Label selector.")
    ] = None,
    namespace: Namespace = None,
    all_namespaces: Annotated[bool, typer.Option("-A", "--all-namespaces")] = False,
    state_dir: StateDir = None,
) -> None:
    """List resources, or show one."""
    cls = _kind(kind)
    if output not in (None, "yaml", "json", "wide", "name"):
        fail(f"unknown output format {output!r}: use yaml, json, wide or name")
    store = _store(state_dir)
    kind_name = cls.model_fields["kind"].default
    ns = _ns(cls, namespace, all_namespaces)
    if name:
        obj = store.get(kind_name, name, ns)
        if obj is None:
            fail(f"{kind_name}/{name} not found" + (f" in namespace {ns}" if ns else ""))
        items = [obj]
    else:
        try:
            items = store.list(kind_name, ns, selector)
        except ValueError as e:
            fail(f"invalid label selector: {e}")
        for message in store.corrupt(kind_name, ns):  # skipped by list: say so, by kind/name
            err.print(f"[yellow]Warning:[/] skipped {escape(message)}")
    items = [in_version(o, cls) for o in items]
    if output == "yaml":
        if name:
            out.print(to_yaml(items[0]), end="")
        else:
            out.print(to_yaml({"apiVersion": "v1", "kind": "List", "items": items}), end="")
        return
    if output == "json":
        data = items[0] if name else {"apiVersion": "v1", "kind": "List", "items": items}
        out.print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return
    if output == "name":
        for o in items:
            out.print(f"{_type_name(cls)}/{o['metadata']['name']}")
        return
    if not items:
        where = f" in {ns} namespace" if ns else ""
        err.print(f"No resources found{where}.")
        return
    _table(cls, items, wide=output == "wide", show_ns=all_namespaces and cls.namespaced)


def _table(cls: type[Resource], items: list[dict[str, Any]], wide: bool, show_ns: bool) -> None:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    columns: list[tuple[str, Callable[[dict[str, Any]], Any]]] = []
    if show_ns:
        columns.append(("NAMESPACE", lambda o: o["metadata"].get("namespace")))
    columns.append(("NAME", lambda o: o["metadata"]["name"]))
    for title, _type, path in cls.printer_columns:
        fallback = cls.printer_fallbacks.get(title)
        columns.append(
            (
                title,
                lambda o, p=path, f=fallback: (
                    v if (v := jsonpath(o, p)) is not None or f is None else jsonpath(o, f)
                ),
            )
        )
    columns.append(("AGE", lambda o: age(o["metadata"].get("creationTimestamp"))))
    if wide:
        columns.append(
            (
                "LABELS",
                lambda o: ",".join(
                    f"{k}={v}" for k, v in (o["metadata"].get("labels") or {}).items()
                ),
            )
        )
    for title, _ in columns:
        table.add_column(title, no_wrap=True)
    for o in items:
        table.add_row(*(escape(cell(fn(o))) for _, fn in columns))
    out.print(table)


@app.command()
def describe(
    kind: Annotated[str, typer.Argument()],
    name: Annotated[str, typer.Argument()],
    namespace: Namespace = None,
    state_dir: StateDir = None,
) -> None:
    """Show a resource with its conditions."""
    cls = _kind(kind)
    kind_name = cls.model_fields["kind"].default
    ns = _ns(cls, namespace)
    obj = _store(state_dir).get(kind_name, name, ns)
    if obj is None:
        fail(f"{kind_name}/{name} not found" + (f" in namespace {ns}" if ns else ""))
    meta = obj["metadata"]
    out.print(f"[bold]Name:[/]         {meta['name']}")
    if ns:
        out.print(f"[bold]Namespace:[/]    {ns}")
    labels = meta.get("labels") or {}
    out.print(
        "[bold]Labels:[/]       "
        + ("\n              ".join(f"{k}={v}" for k, v in labels.items()) or "<none>")
    )
    annotations = meta.get("annotations") or {}
    out.print(
        "[bold]Annotations:[/]  "
        + ("\n              ".join(f"{k}: {v}" for k, v in annotations.items()) or "<none>")
    )
    out.print(f"[bold]API Version:[/]  {obj['apiVersion']}")
    out.print(f"[bold]Kind:[/]         {obj['kind']}")
    out.print(
        f"[bold]Created:[/]      {meta.get('creationTimestamp')} ({age(meta.get('creationTimestamp'))} ago)"
    )
    out.print(f"[bold]Generation:[/]   {meta.get('generation')}")
    out.print("[bold]Spec:[/]")
    out.print(_indent(to_yaml(obj.get("spec", {})), 2), end="")
    status = dict(obj.get("status") or {})
    conditions = status.pop("conditions", None) or []
    if status:
        out.print("[bold]Status:[/]")
        out.print(_indent(to_yaml(status), 2), end="")
    out.print("[bold]Conditions:[/]")
    if not conditions:
        out.print("  <none>")
    else:
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
        for col in ("TYPE", "STATUS", "REASON", "AGE", "MESSAGE"):
            table.add_column(col)
        for c in conditions:
            table.add_row(
                c.get("type", ""),
                c.get("status", ""),
                c.get("reason", ""),
                age(c.get("lastTransitionTime")),
                c.get("message", ""),
            )
        out.print(table)
    from llmplane.controlplane.events import events_for

    events = events_for(_store(state_dir), obj)[-10:]
    out.print("[bold]Events:[/]")
    if not events:
        out.print("  <none>")
        return
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for col in ("TYPE", "REASON", "AGE", "COUNT", "MESSAGE"):
        table.add_column(col)
    for e in events:
        table.add_row(
            e.get("type", ""),
            e.get("reason", ""),
            age(e.get("lastTimestamp")),
            str(e.get("count", 1)),
            e.get("message", ""),
        )
    out.print(table)


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


@app.command()
def delete(
    kind: Annotated[str | None, typer.Argument()] = None,
    names: Annotated[list[str] | None, typer.Argument()] = None,
    files: Annotated[list[str] | None, typer.Option("-f", "--filename")] = None,
    namespace: Namespace = None,
    ignore_not_found: Annotated[bool, typer.Option("--ignore-not-found")] = False,
    state_dir: StateDir = None,
) -> None:
    """Delete resources by kind and name, or every resource in files."""
    targets: list[tuple[type[Resource], str, str | None]] = []
    if files:
        for r in _read(files).resources:
            targets.append((type(r), r.name, r.namespace))
    elif kind and names:
        cls = _kind(kind)
        targets = [(cls, n, _ns(cls, namespace)) for n in names]
    else:
        fail("name the resources: llmplane delete KIND NAME [NAME...] or -f FILE")
    store = _store(state_dir)
    missing = []
    for cls, name, ns in targets:
        kind_name = cls.model_fields["kind"].default
        if store.delete(kind_name, name, ns) is None:
            missing.append(f"{kind_name}/{name} not found")
        else:
            out.print(f"{_type_name(cls)}/{name} deleted")
    if missing and not ignore_not_found:
        fail("; ".join(missing))


@app.command()
def crds(
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Write one file per CRD into this directory.")
    ] = None,
) -> None:
    """Print apiextensions.k8s.io/v1 CRDs for every kind."""
    from llmplane.api.crds import crd_documents, write_crds

    if out_dir:
        for path in write_crds(out_dir):
            out.print(str(path))
        return
    import yaml

    sys.stdout.write(yaml.safe_dump_all(crd_documents(), sort_keys=False))


@app.command("api-resources")
def api_resources() -> None:
    """List every kind with its short names, API version and scope."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for col in ("NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"):
        table.add_column(col)
    for kind, cls in sorted(KINDS.items(), key=lambda kv: kv[1].plural):
        table.add_row(
            cls.plural,
            ",".join(cls.short_names),
            cls.api_version_string(),
            str(cls.namespaced).lower(),
            kind,
        )
    out.print(table)


@app.command()
def up(
    files: Annotated[
        list[str] | None,
        typer.Option("-f", "--filename", help="Files or directories to apply first."),
    ] = None,
    port: Annotated[
        int, typer.Option("--port", help="Gateway port on 127.0.0.1 (0: any free port).")
    ] = 8000,
    host: Annotated[str, typer.Option("--host", help="Address the gateway binds.")] = "127.0.0.1",
    state_dir: StateDir = None,
    gateway_config: Annotated[
        Path | None,
        typer.Option(
            "--gateway-config", help="Gateway config: scheduling profiles, limits (YAML)."
        ),
    ] = None,
    flow_control: Annotated[
        bool | None,
        typer.Option(
            "--flow-control/--no-flow-control",
            help="Queue requests in the gateway by priority and tenant while every replica is "
            "saturated (default: on, or gateway.flowControl in --gateway-config).",
            show_default=False,
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            help="This host's NVIDIA GPUs to place replicas on (e.g. 0,1,2,3); "
            "default: what nvidia-smi lists.",
        ),
    ] = None,
    autoscale_interval: Annotated[
        float,
        typer.Option(
            "--autoscale-interval", min=0.05, help="Seconds between autoscaling decisions."
        ),
    ] = 1.0,
    autoscale_window: Annotated[
        float,
        typer.Option(
            "--autoscale-window", min=0.0, help="Seconds of load samples averaged per replica."
        ),
    ] = 15.0,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            max=64,
            help="Gateway processes serving the port, sharing one routing state "
            "(see docs/gateway.md, Workers).",
        ),
    ] = 1,
    access_log: Annotated[
        bool,
        typer.Option("--access-log", help="Print one JSON line per gateway request on stdout."),
    ] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
) -> None:
    """Run the platform: store, controllers, engine processes and the OpenAI gateway."""
    import asyncio
    import logging
    import socket

    from rich.logging import RichHandler

    from llmplane.runtime.capacity import CeilingSettingError, replica_ceiling
    from llmplane.store.paths import state_dir as resolve_state_dir
    from llmplane.up import run_up

    try:
        replica_ceiling()  # a bad LLMPLANE_MAX_REPLICAS is one line now, not a traceback later
    except CeilingSettingError as e:
        fail(str(e))
    gpu_ids = None
    if gpus is not None:
        from llmplane.runtime.placement import parse_device_list

        try:
            gpu_ids = parse_device_list(gpus)
        except ValueError as e:
            fail(str(e))
    docs: list[dict[str, Any]] = []
    if files:
        parsed = _read(files)
        _warn(parsed.warnings)
        _check_capacity(parsed.resources)
        docs = [stored_form(r) for r in parsed.resources]
    if port:
        with socket.socket() as probe:
            # As the real listener binds: connections the last `up` left in TIME_WAIT are fine.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                fail(
                    f"port {port} on {host} is in use: pass --port N (or --port 0 for any free port)"
                )
    config = None
    if gateway_config is not None:
        from llmplane.gateway.config import ConfigFileError, load_checked

        try:
            config = load_checked(gateway_config)  # a bad profile is refused now, not after start
        except ConfigFileError as e:
            fail(str(e))
    if flow_control is not None:
        from llmplane.gateway.config import GatewayConfig

        config = config or GatewayConfig()
        config.flow_control = flow_control
    directory = resolve_state_dir(state_dir)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=err, show_path=False, rich_tracebacks=False)],
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    from llmplane.fdlimit import raise_open_files

    raise_open_files()  # before the workers fork (they inherit it): llmplane/fdlimit.py
    if access_log:
        import sys

        from llmplane.gateway.observability import install_access_sink

        logging.getLogger("llmplane.gateway.access").setLevel(logging.INFO)
        install_access_sink(sys.stdout.fileno())
    elif not verbose:
        logging.getLogger("llmplane.gateway.access").setLevel(logging.WARNING)

    def ready(platform: Any) -> None:
        from llmplane.upstatus import UpStatus

        err.print(
            f"[bold green]llmplane is up[/]: OpenAI API at http://{host}:{platform.port}/v1 "
            f"(state in {directory}). Ctrl-C stops it.\n"
            f"  console:   http://{host}:{platform.port}/console/\n"
            f"  watch it:  llmplane get playgrounds --state-dir {directory}"
        )
        platform.spawn(UpStatus(platform, err).run(), "status")

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from llmplane.runtime.local import StateDirInUse

    fleet = None
    if workers > 1:
        from llmplane.gateway.config import GatewayConfig
        from llmplane.upworkers import UpWorkers

        config = config or GatewayConfig()
        try:  # forked before the event loop: see llmplane/upworkers.py
            fleet = UpWorkers(workers, host, port, directory, config)
        except OSError as e:
            fail(f"cannot listen on {host}:{port}: {e.strerror or e}")
    try:
        from llmplane.controlplane.autoscaler import AutoscalerConfig

        scaling = AutoscalerConfig(interval=autoscale_interval, window=autoscale_window)
        asyncio.run(
            run_up(
                directory,
                docs,
                host,
                port,
                ready,
                gateway_config=config,
                gpus=gpu_ids,
                autoscaler_config=scaling,
                workers=fleet,
            )
        )
    except StateDirInUse as e:
        fail(str(e))
    except RuntimeError as e:
        if fleet is None:
            raise
        fail(str(e))
    finally:
        if fleet is not None:
            fleet.close()


def _workload(target: str, namespace: str | None) -> tuple[str, str]:
    kind, _, name = target.partition("/")
    if not name:
        fail("name the workload as pl/NAME or isvc/NAME")
    cls = _kind(kind)
    if cls.model_fields["kind"].default not in ("Playground", "Service"):
        fail("logs are kept for Playgrounds and Services: pl/NAME or isvc/NAME")
    return namespace or "default", name


@app.command()
def logs(
    target: Annotated[str, typer.Argument(help="pl/NAME or isvc/NAME")],
    replica: Annotated[int, typer.Option("--replica", "-r", help="Replica index.")] = 0,
    follow: Annotated[bool, typer.Option("-f", "--follow")] = False,
    tail: Annotated[int, typer.Option("--tail", help="Lines to show (-1: all).")] = -1,
    namespace: Namespace = None,
    state_dir: StateDir = None,
) -> None:
    """Show (and follow) an engine replica's log."""
    import contextlib
    import os
    import time

    from llmplane.store.paths import state_dir as resolve_state_dir

    ns, name = _workload(target, namespace)
    path = resolve_state_dir(state_dir) / "logs" / ns / name / f"replica-{replica}.log"
    if not path.exists():
        fail(f"no log for {target} replica {replica} (looked at {path})")
    backup = path.with_name(path.name + ".1")  # the part cut off by size rotation
    with path.open("rb") as f:
        lines = f.readlines()
        if tail < 0 or len(lines) < tail:
            with contextlib.suppress(OSError):
                lines = backup.read_bytes().splitlines(keepends=True) + lines
        if tail >= 0:
            lines = lines[-tail:] if tail else []
        sys.stdout.buffer.write(b"".join(lines))
        sys.stdout.flush()
        while follow:
            chunk = f.read()
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            else:
                if f.tell() > os.fstat(f.fileno()).st_size:
                    f.seek(0)  # rotated (copied away and truncated): read on from the start
                time.sleep(0.25)


_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command(context_settings=_PASSTHROUGH, add_help_option=False)
def sim(ctx: typer.Context) -> None:
    """Run the simulated vLLM-compatible engine (see: llmplane sim --help)."""
    from llmplane.sim.cli import main as sim_main

    raise typer.Exit(sim_main(list(ctx.args)))


@app.command("load-model", context_settings=_PASSTHROUGH, add_help_option=False)
def load_model(ctx: typer.Context) -> None:
    """Download a model into a cache directory (the Kubernetes init container's job)."""
    from llmplane.loader.command import main as load_main

    raise typer.Exit(load_main(list(ctx.args)))


@app.command(context_settings=_PASSTHROUGH, add_help_option=False)
def gateway(ctx: typer.Context) -> None:
    """Run the gateway on its own, routing to registered endpoints (see: llmplane gateway --help)."""
    from llmplane.gateway.cli import main as gateway_main

    raise typer.Exit(gateway_main(list(ctx.args)))


@app.command(context_settings=_PASSTHROUGH, add_help_option=False)
def epp(ctx: typer.Context) -> None:
    """Run the endpoint picker for Envoy's ext_proc filter (see: llmplane epp --help)."""
    from llmplane.epp.cli import main as epp_main

    raise typer.Exit(epp_main(list(ctx.args)))


@app.command(context_settings=_PASSTHROUGH, add_help_option=False)
def render(ctx: typer.Context) -> None:
    """Print the Kubernetes objects the operator would create (see: llmplane render --help)."""
    from llmplane.render import main as render_main

    raise typer.Exit(render_main(list(ctx.args)))


@app.command(context_settings=_PASSTHROUGH, add_help_option=False)
def operator(ctx: typer.Context) -> None:
    """Run the Kubernetes operator (see: llmplane operator --help)."""
    from llmplane.operator.main import main as operator_main

    raise typer.Exit(operator_main(list(ctx.args)))


@app.command()
def usage(
    since: Annotated[
        str, typer.Option("--since", help="Window back from now: 30m, 1h, 24h, 7d.")
    ] = "1h",
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
    output: Annotated[str | None, typer.Option("-o", "--output", help="json.")] = None,
    state_dir: StateDir = None,
) -> None:
    """Requests and tokens per tenant and model over a time window (the gateways' usage
    records in the state directory, written every few seconds; see docs/tenants.md)."""
    import time

    from llmplane.store.paths import state_dir as resolve_state_dir
    from llmplane.store.usage import USAGE_FILENAME, UsageLog

    if output not in (None, "json"):
        fail(f"unknown output format {output!r}: use json (or nothing for a table)")
    try:
        window = _window(since)
    except ValueError as e:
        fail(f"--since: {e}")
    rows = UsageLog(resolve_state_dir(state_dir) / USAGE_FILENAME).totals(
        time.time() - window, tenant=tenant
    )
    if output == "json":
        sys.stdout.write(orjson.dumps([r.__dict__ for r in rows]).decode() + "\n")
        return
    if not rows:
        out.print(f"no usage recorded in the last {since}")
        return
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for col in ("TENANT", "MODEL", "REQUESTS", "INPUT TOKENS", "OUTPUT TOKENS"):
        table.add_column(col, justify="left" if col in ("TENANT", "MODEL") else "right")
    for r in rows:
        table.add_row(
            escape(r.tenant),
            escape(r.model),
            str(r.requests),
            str(r.input_tokens),
            str(r.output_tokens),
        )
    if len(rows) > 1:
        sums = [
            sum(getattr(r, f) for r in rows) for f in ("requests", "input_tokens", "output_tokens")
        ]
        table.add_row("TOTAL", "", *(str(n) for n in sums))
    out.print(table)


def _window(text: str) -> float:
    """Seconds in ``7d`` or a Go duration (``90m``, ``1h30m``); positive."""
    from llmplane.api.units import parse_duration

    text = text.strip()
    seconds = float(text[:-1]) * 86400 if text.endswith("d") and text[:-1].isdigit() else None
    if seconds is None:
        try:
            seconds = parse_duration(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a duration such as 30m, 1h, 24h or 7d") from None
    if seconds <= 0:
        raise ValueError(f"{text!r} must be a positive duration such as 1h or 7d")
    return seconds


@app.command()
def version() -> None:
    """The installed version."""
    from llmplane import __version__

    out.print(f"llmplane {__version__}")


from llmplane.keys import KeyError_  # noqa: E402
from llmplane.keys import app as _keys_app  # noqa: E402

app.add_typer(_keys_app, name="keys")


def main(argv: list[str] | None = None) -> int:
    """Entry point: user mistakes become a message and exit status 1, never a traceback.

    Usage errors (unknown options, missing arguments) are click's: it prints them with the
    usage line and exits with status 2.
    """
    from llmplane.store.base import StoreError

    try:
        app(args=argv)
    except InvalidResources as e:
        for message in e.messages:
            err.print(f"[red]error:[/] {escape(message)}")
        return 1
    except (UserError, StoreError, KeyError_) as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
