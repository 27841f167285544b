"""Settings of one simulated model server, with defaults for an 8B model on one H100.

Every time below is in seconds of *modelled* GPU time; the engine multiplies it by
``time_scale`` before sleeping (0 = no latency at all). Where the figures come from is
written down in docs/sim.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROLES = ("both", "prefill", "decode")
SCHEDULING_POLICIES = ("fcfs", "priority")  # vLLM's --scheduling-policy


@dataclass
class TimingModel:
    """Cost of one engine step: ``step = base + prefill part + decode part + LoRA loads``."""

    # One forward pass of the weights (memory bound: 16 GB of bf16 at ~3 TB/s, plus launch
    # overhead); paid once per step whatever the batch.
    step_base: float = 0.0065
    # Extra fixed cost of a step that contains prefill tokens (attention setup, sampling).
    prefill_overhead: float = 0.002
    # Per uncached prompt token (compute bound: 2 x 8e9 FLOP at ~450 TFLOP/s effective).
    prefill_per_token: float = 0.000035
    # Per running sequence in a decode step (sampling, scheduling, small kernels).
    decode_per_seq: float = 0.00002
    # Per token of context read by a decode step (128 KiB of KV per token at ~3.3 TB/s).
    decode_per_kv_token: float = 0.00000004
    # Loading one LoRA adapter into a free GPU slot.
    lora_load: float = 0.02
    # PD: fixed and per-token cost of pulling the KV cache from the prefill instance.
    kv_transfer: float = 0.005
    kv_transfer_per_token: float = 0.000005

    def step_time(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        context_tokens: int,
        lora_loads: int = 0,
    ) -> float:
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        t = self.step_base
        if prefill_tokens:
            t += self.prefill_overhead + prefill_tokens * self.prefill_per_token
        t += decode_seqs * self.decode_per_seq + context_tokens * self.decode_per_kv_token
        return t + lora_loads * self.lora_load

    def transfer_time(self, tokens: int) -> float:
        return self.kv_transfer + tokens * self.kv_transfer_per_token


@dataclass
class Faults:
    """Injected failures; all may be changed at run time over ``/admin/faults``."""

    error_rate: float = 0.0  # share of inference requests answered with an error status
    error_codes: list[int] = field(default_factory=lambda: [500])
    crash_after: int | None = None  # the process exits when request crash_after+1 arrives
    hang_rate: float = 0.0  # share of inference requests accepted and never answered
    slow_start: float = 0.0  # /health answers 503 for this many seconds after start
    disconnect_after: int | None = None  # close a stream after this many chunks
    disconnect_rate: float = 1.0  # share of streams the disconnect applies to
    # End a stream after this many chunks with an error event and [DONE], as vLLM does when
    # its engine fails mid-generation (the same disconnect_rate share of streams).
    error_event_after: int | None = None
    # The next this many KV event batches are numbered and kept for replay but not sent (a
    # subscriber sees a gap in the sequence numbers).
    kv_events_drop: int = 0

    KEYS = (
        "error_rate",
        "error_codes",
        "crash_after",
        "hang_rate",
        "slow_start",
        "disconnect_after",
        "disconnect_rate",
        "error_event_after",
        "kv_events_drop",
    )

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}

    def update(self, data: dict) -> None:
        """Apply a partial update; raises ValueError naming the bad field."""
        unknown = set(data) - set(self.KEYS)
        if unknown:
            raise ValueError(f"unknown fault field(s): {', '.join(sorted(unknown))}")
        new = {k: getattr(self, k) for k in self.KEYS}
        new.update(data)
        for key in ("error_rate", "hang_rate", "disconnect_rate"):
            v = new[key]
            if not isinstance(v, int | float) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
                raise ValueError(f"{key} must be a number in [0, 1]")
        codes = new["error_codes"]
        if (
            not isinstance(codes, list)
            or not codes
            or not all(isinstance(c, int) and 400 <= c <= 599 for c in codes)
        ):
            raise ValueError("error_codes must be a non-empty list of HTTP status codes 400..599")
        v = new["kv_events_drop"]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError("kv_events_drop must be an integer >= 0")
        for key in ("crash_after", "disconnect_after", "error_event_after"):
            v = new[key]
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"{key} must be null or an integer >= 0")
        v = new["slow_start"]
        if not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
            raise ValueError("slow_start must be a number >= 0")
        for k in self.KEYS:
            setattr(self, k, new[k])


@dataclass
class SimConfig:
    model: str
    served_model_names: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8000
    seed: int = 0
    time_scale: float = 1.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_blocks: int = 26000
    block_size: int = 16
    max_model_len: int = 131072
    enable_prefix_caching: bool = True
    vocab_size: int = 128256
    mean_output_len: int = 256
    max_loras: int = 1
    lora_modules: dict[str, str] = field(default_factory=dict)
    role: str = "both"
    # vLLM's --scheduling-policy: "fcfs" (arrival order; a request's "priority" is accepted
    # and ignored, as vLLM 0.32 does) or "priority" (lower "priority" first, then arrival).
    scheduling_policy: str = "fcfs"
    engine_id: str | None = None
    shutdown_timeout: float = 10.0
    # A benchmark aid, not vLLM's: each stream ends (before ``[DONE]``) with an SSE comment
    # ``: llmplane-sim-timing {...}`` giving where its time to first token went in the engine.
    report_timing: bool = False
    timing: TimingModel = field(default_factory=TimingModel)
    faults: Faults = field(default_factory=Faults)
    # vLLM's --kv-events-config (llmplane/sim/kvevents.py; None: no events) and the form of
    # its events: "map" (vLLM 0.32) or "positional" (earlier releases).
    kv_events: Any = None
    kv_events_wire: str = "map"

    @property
    def model_name(self) -> str:
        """The name requests use and metrics carry (first served name, else --model)."""
        return self.served_model_names[0] if self.served_model_names else self.model
