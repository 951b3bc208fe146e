"""The Sandbox seam: run a program with a deadline and resource limits, get a typed result back.

Owns: the interface every backend implements (``Sandbox`` for one-shot runs, ``SandboxSession`` for
state across the turns of one episode), the ``Limits`` and ``ExecResult`` records, the status
vocabulary. The backend choice lives in ``agentrl.sandbox.factory``.

Does not: decide what a result *means* to a model (``agentrl.tools`` formats it), nor isolate
anything itself. Each backend's module docstring says what it isolates and what it does not:
``agentrl.sandbox.local`` (rlimits + bubblewrap namespaces when available),
``agentrl.sandbox.docker`` (hardened containers, warm pool), ``agentrl.sandbox.subprocess_runner``
(no isolation at all; tests and trusted workloads).

Contract for backends
---------------------

* ``run`` returns within ``timeout_s`` plus a small grace for cleanup (a few seconds at most),
  whatever the program does; everything the program started is gone afterwards (a session's
  processes are gone after each ``run`` too: only its files persist).
* The program's own failures are *results*, never exceptions: non-zero exit, timeout, memory,
  output over the cap, death by signal all come back as an ``ExecResult`` with a ``status``.
* Infrastructure failures (the backend cannot start the program, the daemon or container is gone,
  the work dir cannot be created) raise ``agentrl.errors.SandboxError``; the episode then ends
  ``sandbox_error`` and is excluded from the loss, never scored as reward 0.
* Caller mistakes (empty argv, ``timeout_s <= 0``, a file name that is absolute or contains
  ``..``) raise ``ValueError`` before anything runs.
* ``files`` ({relative path: bytes}) are written into the work dir before the program starts.
* ``collect`` names relative paths to copy out of the work dir after the program ends, into
  ``ExecResult.files``. A path that is absent, absolute, contains ``..``, is not a regular file,
  resolves (through symlinks) outside the work dir, or is over the size cap is *not* collected
  and is named in ``ExecResult.detail``; it is never an exception (the program controls the work
  dir, so a bad entry there is the program's doing). ``agentrl.sandbox.files`` implements this.
* ``limits`` override the sandbox's default ``Limits`` for one run (or one session); every backend
  enforces what it can and its docstring lists what it cannot.
* ``run`` is safe to call concurrently from one event loop; a backend bounds how many programs run
  at once (a sandbox is shared process-wide so that bound is global).

Docker backend hook used by ``make_sandbox("auto")`` (``agentrl.sandbox.factory``): ``agentrl.sandbox.docker`` exposes
``DockerSandbox`` and ``unavailable_reason(**options) -> str | None`` (None when a daemon answers
and the image exists, else why not).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentrl.errors import ConfigError

#: Every value ``ExecResult.status`` may take.
STATUSES = ("ok", "timeout", "oom", "output_limit", "killed", "error")


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run (or one session). Every backend enforces what it can and documents
    what it cannot (see its module docstring)."""

    memory_mb: int = 512
    """Memory. Docker: cgroup memory, with memory+swap equal to it. Local: address space (RLIMIT_AS)."""
    cpus: float = 1.0
    """CPU share. Docker: CPU quota. Local: not a share; RLIMIT_CPU = ceil(timeout) + 1 s of CPU time."""
    pids: int = 64
    """Processes + threads the program may have at once."""
    nofile: int = 256
    """Open file descriptors per process."""
    fsize_mb: int = 64
    """Largest file the program may write (RLIMIT_FSIZE)."""
    disk_mb: int = 128
    """Size of the work dir (and of a private /tmp, /dev/shm). Docker: tmpfs size. Local: a tmpfs of
    this size when the trainer is root; otherwise only ``fsize_mb`` per file bounds it."""
    max_output_bytes: int = 65536
    """Per stream (stdout, stderr). Going over kills the program with status ``output_limit``."""

    def __post_init__(self) -> None:
        for name in ("memory_mb", "pids", "nofile", "fsize_mb", "disk_mb", "max_output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"Limits.{name} must be an integer >= 1, got {value!r}")
        if (
            isinstance(self.cpus, bool)
            or not isinstance(self.cpus, (int, float))
            or not math.isfinite(self.cpus)
            or self.cpus <= 0
        ):
            raise ConfigError(f"Limits.cpus must be a number > 0, got {self.cpus!r}")


@dataclass(frozen=True)
class ExecResult:
    """What one run produced.

    ``status``: ``ok`` the program ran to its end (any exit code); ``timeout`` it was killed at its
    deadline; ``oom`` it died for lack of memory (see the backend for how that is detected);
    ``output_limit`` killed because stdout or stderr passed the cap; ``killed`` it died by a signal
    the sandbox did not send (``exit_code`` is then ``-signal``); ``error`` the backend failed after
    the program started (``detail`` says how). ``exit_code`` is None when the sandbox killed it.
    ``truncated``: some output was cut. ``files``: what ``collect`` copied out. ``detail``: a
    human-readable why (for error/killed/oom, and the paths ``collect`` refused).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    status: str
    wall_s: float
    truncated: bool = False
    files: Mapping[str, bytes] = field(default_factory=dict)
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Ran to its end and exited 0."""
        return self.status == "ok" and self.exit_code == 0


class SandboxSession(abc.ABC):
    """State across the turns of one episode: every ``run`` uses the same work dir (docker: the same
    container), so files written by one turn are there for the next. Processes do not survive a
    ``run``. Use as ``async with await sandbox.session() as s:`` or call ``close()``; ``close`` is
    idempotent, and ``run`` after ``close`` raises SandboxError."""

    @abc.abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        files: Mapping[str, bytes] | None = None,
        collect: Sequence[str] = (),
    ) -> ExecResult:
        """Like ``Sandbox.run`` but in this session's work dir, with the session's limits."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Remove the work dir (docker: the container). Idempotent."""

    async def __aenter__(self) -> SandboxSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Sandbox(abc.ABC):
    """Runs argv (no shell) in an isolated working directory. See the module docstring's contract."""

    name: str = "sandbox"

    @abc.abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        files: Mapping[str, bytes] | None = None,
        limits: Limits | None = None,
        collect: Sequence[str] = (),
    ) -> ExecResult:
        """Run ``argv`` once in a fresh work dir holding ``files``; stdin closed unless given;
        ``collect``: relative paths copied out after the run (escapes refused, named in detail)."""

    async def session(self, *, limits: Limits | None = None) -> SandboxSession:
        """Open a session (state across the turns of one episode). Backends that support sessions
        override this; ``supports_sessions(sb)`` tells whether one does."""
        raise NotImplementedError(f"the {self.name!r} sandbox ({type(self).__name__}) has no sessions")

    async def aclose(self) -> None:
        """Release pooled resources (containers, warm processes). The default holds none."""

    def isolation_summary(self) -> str:
        """One line for people: which isolation layers are on, and what to install for more."""
        return f"{self.name}: no isolation described"


def env_isolation_line(env: object) -> str | None:
    """``sandbox: ...`` for the env's sandbox (an env that keeps one in ``.sandbox``), else None."""
    sb = getattr(getattr(env, "unwrapped", env), "sandbox", None)
    return f"sandbox: {sb.isolation_summary()}" if isinstance(sb, Sandbox) else None


def supports_sessions(sandbox: Sandbox) -> bool:
    """Whether ``sandbox.session()`` is implemented (checked up front by envs asking for sessions)."""
    return type(sandbox).session is not Sandbox.session


__all__ = ["STATUSES", "ExecResult", "Limits", "Sandbox", "SandboxSession", "env_isolation_line", "supports_sessions"]
