"""``llmplane sim`` / ``python -m llmplane.sim``: run one simulated vLLM server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from llmplane.aio import run
from llmplane.sim.config import ROLES, SCHEDULING_POLICIES, Faults, SimConfig, TimingModel
from llmplane.sim.kvevents import KVEventsConfig

log = logging.getLogger("llmplane.sim")


def _lora_module(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def _codes(text: str) -> list[int]:
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated status codes, got {text!r}"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    t = TimingModel()
    d = SimConfig(model="x")
    p = argparse.ArgumentParser(
        prog="llmplane sim",
        description="Simulated vLLM server: vLLM's HTTP API, metrics and engine behaviour "
        "(continuous batching, paged KV cache, prefix caching, LoRA, PD) without a GPU.",
    )
    p.add_argument("--model", required=True, help="Model name (also the served name).")
    p.add_argument("--served-model-name", nargs="+", default=[], help="Names to serve it as.")
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port, help="0 picks a free port.")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--time-scale", type=float, default=d.time_scale,
                   help="Multiplies every modelled delay; 0 = no latency.")  # fmt: skip
    g = p.add_argument_group("engine")
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    g.add_argument("--num-blocks", "--num-gpu-blocks-override", type=int, default=d.num_blocks,
                   dest="num_blocks")  # fmt: skip
    g.add_argument("--block-size", type=int, default=d.block_size)
    g.add_argument("--max-model-len", type=int, default=d.max_model_len)
    g.add_argument("--no-enable-prefix-caching", action="store_true")
    g.add_argument("--vocab-size", type=int, default=d.vocab_size)
    g.add_argument(
        "--scheduling-policy",
        choices=SCHEDULING_POLICIES,
        default=d.scheduling_policy,
        help="as vLLM's: priority orders the waiting queue by the request's "
        "'priority' (lower first), then arrival",
    )
    g.add_argument("--mean-output-len", type=int, default=d.mean_output_len,
                   help="Mean tokens before EOS (geometric) unless ignore_eos.")  # fmt: skip
    g = p.add_argument_group("timing (seconds of modelled GPU time)")
    g.add_argument("--step-time", type=float, default=t.step_base)
    g.add_argument("--prefill-overhead", type=float, default=t.prefill_overhead)
    g.add_argument("--prefill-time-per-token", type=float, default=t.prefill_per_token)
    g.add_argument("--decode-time-per-seq", type=float, default=t.decode_per_seq)
    g.add_argument("--decode-time-per-kv-token", type=float, default=t.decode_per_kv_token)
    g = p.add_argument_group("LoRA")
    g.add_argument("--enable-lora", action="store_true", help="Accepted for vLLM parity.")
    g.add_argument("--max-loras", type=int, default=d.max_loras)
    g.add_argument("--max-lora-rank", type=int, default=16, help="Accepted, ignored.")
    g.add_argument("--lora-modules", nargs="+", type=_lora_module, default=[],
                   metavar="NAME=PATH")  # fmt: skip
    g.add_argument("--lora-load-latency", type=float, default=t.lora_load)
    g = p.add_argument_group("prefill/decode disaggregation")
    g.add_argument("--role", choices=ROLES, default=d.role)
    g.add_argument("--kv-transfer-latency", type=float, default=t.kv_transfer)
    g.add_argument("--kv-transfer-time-per-token", type=float, default=t.kv_transfer_per_token)
    g.add_argument("--engine-id", default=None)
    g = p.add_argument_group("fault injection (also POST /admin/faults)")
    f = Faults()
    g.add_argument("--fault-error-rate", type=float, default=f.error_rate)
    g.add_argument("--fault-error-codes", type=_codes, default=f.error_codes)
    g.add_argument("--fault-crash-after", type=int, default=None)
    g.add_argument("--fault-hang-rate", type=float, default=f.hang_rate)
    g.add_argument("--fault-slow-start", type=float, default=f.slow_start)
    g.add_argument("--fault-disconnect-after", type=int, default=None)
    g.add_argument("--fault-disconnect-rate", type=float, default=f.disconnect_rate)
    g.add_argument("--fault-error-event-after", type=int, default=None)
    g = p.add_argument_group("KV-cache events (llmplane/sim/kvevents.py)")
    g.add_argument(
        "--kv-events-config",
        default=None,
        help='as vLLM\'s: JSON, e.g. \'{"enable_kv_cache_events": true, "publisher": '
        '"zmq", "endpoint": "ipc:///tmp/kv.sock", "replay_endpoint": '
        '"ipc:///tmp/kv-replay.sock"}\'',
    )
    g.add_argument(
        "--kv-events-wire",
        choices=("map", "positional"),
        default="map",
        help="map: events tagged by 'type' (vLLM 0.32); positional: tagged arrays (earlier)",
    )
    p.add_argument("--shutdown-timeout", type=float, default=d.shutdown_timeout)
    p.add_argument("--log-level", default="warning")
    p.add_argument(
        "--report-timing",
        action="store_true",
        help="end each stream with an SSE comment giving its engine-side TTFT parts "
        "(a benchmark aid; clients ignore comments)",
    )
    return p


def config_from_args(a: argparse.Namespace) -> SimConfig:
    faults = Faults()
    faults.update(
        {
            "error_rate": a.fault_error_rate,
            "error_codes": a.fault_error_codes,
            "crash_after": a.fault_crash_after,
            "hang_rate": a.fault_hang_rate,
            "slow_start": a.fault_slow_start,
            "disconnect_after": a.fault_disconnect_after,
            "disconnect_rate": a.fault_disconnect_rate,
            "error_event_after": a.fault_error_event_after,
        }
    )
    timing = TimingModel(
        step_base=a.step_time,
        prefill_overhead=a.prefill_overhead,
        prefill_per_token=a.prefill_time_per_token,
        decode_per_seq=a.decode_time_per_seq,
        decode_per_kv_token=a.decode_time_per_kv_token,
        lora_load=a.lora_load_latency,
        kv_transfer=a.kv_transfer_latency,
        kv_transfer_per_token=a.kv_transfer_time_per_token,
    )
    for name in ("max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size",
                 "max_model_len", "max_loras", "vocab_size"):  # fmt: skip
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if a.time_scale < 0:
        raise ValueError("--time-scale must be >= 0")
    kv_events = KVEventsConfig.parse(a.kv_events_config) if a.kv_events_config else None
    return SimConfig(
        model=a.model,
        served_model_names=list(a.served_model_name),
        host=a.host,
        port=a.port,
        seed=a.seed,
        time_scale=a.time_scale,
        max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        num_blocks=a.num_blocks,
        block_size=a.block_size,
        max_model_len=a.max_model_len,
        enable_prefix_caching=not a.no_enable_prefix_caching,
        vocab_size=a.vocab_size,
        mean_output_len=a.mean_output_len,
        max_loras=a.max_loras,
        lora_modules=dict(a.lora_modules),
        role=a.role,
        scheduling_policy=a.scheduling_policy,
        engine_id=a.engine_id,
        shutdown_timeout=a.shutdown_timeout,
        report_timing=a.report_timing,
        timing=timing,
        faults=faults,
        kv_events=kv_events,
        kv_events_wire=a.kv_events_wire,
    )


async def serve(cfg: SimConfig, ready: asyncio.Event | None = None,
                stop: asyncio.Event | None = None) -> None:  # fmt: skip
    """Serve until ``stop`` is set (or SIGTERM/SIGINT), then drain and return."""
    from aiohttp import web

    from llmplane.sim.server import SimServer

    sim = SimServer(cfg)
    server = web.Server(sim.handle, handler_cancellation=True, access_log=None)
    runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=cfg.shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=2048, reuse_address=True)
    await site.start()
    sim.start()
    listening = site._server
    port = listening.sockets[0].getsockname()[1] if listening and listening.sockets else cfg.port
    sim.port = port
    sys.stdout.write(f"LISTENING {cfg.host}:{port}\n")
    sys.stdout.flush()
    if ready is not None:
        ready.set()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        # Stop accepting, let in-flight requests finish (bounded), then close.
        sim.cancel_hanging()
        await runner.cleanup()
        await sim.close()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        parser.error(str(e))
    try:
        run(serve(cfg))
    except OSError as e:
        sys.stderr.write(f"llmplane sim: {e}\n")
        return 1
    return 0
