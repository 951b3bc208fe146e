"""The Sandbox seam (``base``), the backend choice (``factory``) and the backends: ``local/`` (the
hardened default: rlimits, bubblewrap namespaces, its executor process), ``docker/`` (hardened
containers; ``docker/agent/`` runs inside them) and ``subprocess_runner`` (no isolation; also the process
mechanics ``local`` builds on). Shared by the backends: ``files`` (copying files in and out), ``slots``
(the concurrency bound), ``probe`` (whether Docker can run here). Re-exports the seam and the factory."""

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
