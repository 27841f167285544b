"""Build the gateway's compiled hot path (everything else is in pyproject.toml).

The modules in ``HOT_PATH`` are compiled by Cython, unchanged, into ``llmplane/_native/``
under a name carrying the hash of the source they were built from; ``llmplane/native.py``
loads a build only while that hash matches the ``.py`` on disk (llmplane/native_build.py
builds them). Without Cython, a C compiler or Python's headers the install is pure Python.
"""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llmplane.native_build import BuildHotPath, extensions

# The modules one proxied request runs through (bench/gateway_ab.py measures what they buy).
HOT_PATH = [
    "llmplane.gateway.http_server",
    "llmplane.gateway.proxy",
    "llmplane.gateway.upstream_client",
    "llmplane.gateway.server",
    "llmplane.gateway.request",
    "llmplane.gateway.usage",
    "llmplane.gateway.registry",
    "llmplane.gateway.admission",
    "llmplane.gateway.outliers",
    "llmplane.gateway.routing",
    "llmplane.gateway.deadlines",
    "llmplane.gateway.observability",
    "llmplane.gateway.hooks",
    "llmplane.gateway.context",
    "llmplane.gateway.scheduler.framework",
    "llmplane.gateway.scheduler.fused",
    "llmplane.gateway.scheduler.plugins",
    "llmplane.gateway.scheduler.prefix",
    "llmplane.gateway.flowcontrol.controller",
    # A Tenant's request: its key, its limits, its usage (docs/benchmarks.md, issue 15).
    "llmplane.gateway.auth",
    "llmplane.gateway.tenant_usage",
    "llmplane.gateway.tokens",
    "llmplane.gateway.ratelimit.buckets",
    "llmplane.gateway.ratelimit.limits",
    "llmplane.gateway.ratelimit.local",
    "llmplane.gateway.ratelimit.limiter",
    # Several workers: the shared in-flight counts every admission and pick reads.
    "llmplane.gateway.workers.inflight",
    "llmplane.gateway.workers.wake",
]

setup(ext_modules=extensions(HOT_PATH), cmdclass={"build_ext": BuildHotPath})
