"""The Sandbox seam (``base``), the backend choice (``factory``) and the backends beside them:
``local`` (+ ``bwrap_view``, ``executor*``, ``child*``, ``warm_python``, ``jail``, ``slots``),
``docker`` (+ ``docker_*``), ``subprocess_runner``; ``files`` copies files in and out. Re-exports the
seam and the factory."""

from agentrl.sandbox.base import (
    STATUSES,
    ExecResult,
    Limits,
    Sandbox,
    SandboxSession,
    env_isolation_line,
    supports_sessions,
)
from agentrl.sandbox.factory import BACKENDS, default_sandbox, docker_unavailable_reason, make_sandbox, shared_sandbox

__all__ = [
    "BACKENDS",
    "STATUSES",
    "ExecResult",
    "Limits",
    "Sandbox",
    "SandboxSession",
    "default_sandbox",
    "docker_unavailable_reason",
    "env_isolation_line",
    "make_sandbox",
    "shared_sandbox",
    "supports_sessions",
]
