"""What the local runtime reports: replica phases and reasons, replica and workload status.

(Endpoints are ``llmplane.runtime.endpoint.Endpoint``, shared with the gateway.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PENDING, STARTING, READY, NOT_READY, TERMINATING, FAILED = (
    "Pending",
    "Starting",
    "Ready",
    "NotReady",
    "Terminating",
    "Failed",
)
ENGINE_NOT_INSTALLED = "EngineNotInstalled"
CRASH_LOOP = "CrashLoopBackOff"
NO_LOCAL_COMMAND = "NoLocalCommand"
STARTUP_PROBE_FAILED = "StartupProbeFailed"
LIVENESS_PROBE_FAILED = "LivenessProbeFailed"
# The engine listened beyond loopback (0.0.0.0, ::, a LAN address) although told 127.0.0.1:
# stopped, and not restarted until the plan changes (a restart would open it again).
LISTENS_BEYOND_LOOPBACK = "ListensBeyondLoopback"
# An engine that served (was Ready) and then exited or failed its liveness probe: it waits out
# its back-off like the others, but it is not known to be failing, so the gateway holds
# requests for it (activator) instead of answering that the engine fails.
RESTARTING = "Restarting"
# llmplane itself ran short of descriptors, memory or processes starting the engine: the
# replica waits and tries again; the engine is not blamed (no back-off, no restart counted).
SHORT_OF_RESOURCES = "ShortOfResources"
# A workload asking for more replicas than the embedded runtime runs per object (capacity.py).
OVER_REPLICA_CEILING = "OverReplicaCeiling"
# Reasons a replica waits out a restart back-off with.
RESTART_REASONS = (CRASH_LOOP, STARTUP_PROBE_FAILED, LIVENESS_PROBE_FAILED, RESTARTING)


@dataclass
class ReplicaStatus:
    index: int
    phase: str  # Pending | Starting | Ready | NotReady | Terminating | Failed
    reason: str | None  # EngineNotInstalled | CrashLoopBackOff | NoLocalCommand | ...
    message: str
    restarts: int
    pid: int | None
    address: str | None
    log_path: Path
    last_exit_code: int | None = None  # of the previous process (negative: killed by signal)
    backoff_seconds: float | None = None  # the current or last restart delay
    template_hash: str = ""  # the plan template this replica runs


@dataclass
class WorkloadStatus:
    replicas: int  # desired
    ready: int  # replica indexes with a Ready process
    items: list[ReplicaStatus] = field(default_factory=list)
    reason: str | None = None  # of the worst replica, for conditions; None when all are ready
    message: str = ""
    updated: int = 0  # replica indexes running the current template


# Which replica speaks for the workload's conditions: higher is worse.
def severity(s: ReplicaStatus) -> int:
    if s.phase == FAILED:
        return 6
    if s.phase == PENDING and s.reason in RESTART_REASONS:
        return 5
    return {NOT_READY: 4, STARTING: 3, PENDING: 2, TERMINATING: 1}.get(s.phase, 0)
