"""The local backend: ``sandbox`` (``LocalSandbox``), bubblewrap's view (``bwrap_view``), the jail plan and
uid pool (``jail``), the trainer's side of the executor (``client``, ``conn``) and the executor itself, a
standard-library-only process started as a script (``executor``, ``child``, ``mounts``, ``wire``,
``warm_python``). Re-exports the backend and its bubblewrap probe."""

from agentrl.sandbox.local.bwrap_view import bwrap_unavailable_reason
from agentrl.sandbox.local.sandbox import LocalSandbox

__all__ = ["LocalSandbox", "bwrap_unavailable_reason"]
