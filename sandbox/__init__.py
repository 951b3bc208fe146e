"""The Sandbox seam: run one command with a deadline, get a typed result back.

Owns: the ``Sandbox`` interface every backend implements (the plain subprocess runner here; a
hardened local backend and a Docker backend later) and the ``ExecResult`` record.

Does not: decide what a result *means* to a model (tools format it), nor enforce anything itself
(each backend documents what it isolates; the subprocess runner isolates nothing).

Contract for backends:

* ``run`` returns within ``timeout_s`` plus a small grace for cleanup, whatever the program does;
  everything the program started is gone afterwards.
* The program's own failures are *results*, never exceptions: non-zero exit, timeout, output
  over the cap, death by signal all come back as an ``ExecResult`` with a ``status``.
* Infrastructure failures (the backend cannot start the program, the daemon is gone) raise
  ``agentrl.errors.SandboxError``; the episode then ends ``sandbox_error`` and is not trained on.
* ``files`` are written, relative to the program's working directory, before it starts.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

#: Every value ``ExecResult.status`` may take.
STATUSES = ("ok", "timeout", "oom", "output_limit", "killed", "error")


@dataclass(frozen=True)
class ExecResult:
    """What one ``Sandbox.run`` produced.

    ``status``: ``ok`` the program ran to its end (any exit code); ``timeout`` it was killed at its
    deadline; ``oom`` killed for memory (backends with a memory limit); ``output_limit`` killed
    because stdout or stderr passed the cap; ``killed`` it died by a signal the sandbox did not
    send (``exit_code`` is then ``-signal``); ``error`` the backend failed after the program started.
    ``exit_code`` is None when the sandbox killed the program. ``truncated``: output was cut.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    status: str
    wall_s: float
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """Ran to its end and exited 0."""
        return self.status == "ok" and self.exit_code == 0


class Sandbox(abc.ABC):
    """Runs argv in an isolated working directory. Safe to call concurrently from one event loop."""

    @abc.abstractmethod
    async def run(self, argv: list[str], *, stdin: bytes | None = None, timeout_s: float,
                  files: dict[str, bytes] | None = None) -> ExecResult:
        """Run ``argv`` (no shell) with ``files`` in its working dir; stdin closed unless given."""

    async def aclose(self) -> None:
        """Release pooled resources (containers, warm processes). The default holds none."""


def default_sandbox() -> Sandbox:
    """The process-wide subprocess sandbox. Shared so that its concurrency bound is global:
    envs are built per episode, and a sandbox per env would bound nothing."""
    global _DEFAULT
    if _DEFAULT is None:
        from agentrl.sandbox.subprocess_runner import SubprocessSandbox

        _DEFAULT = SubprocessSandbox()
    return _DEFAULT


_DEFAULT: Sandbox | None = None

__all__ = ["STATUSES", "ExecResult", "Sandbox", "default_sandbox"]
