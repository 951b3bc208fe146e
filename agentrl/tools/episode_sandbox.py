"""What an env's tools run through, and how a sandbox result is shown to the model.

Owns: how a sandbox result is shown to the model (``format_exec_result``), and ``EpisodeSandbox``, what an env's
tools run through:
the shared one-shot sandbox, or one ``SandboxSession`` per episode (opened at the first call,
closed at the next reset or ``env.close()``) so files persist across the turns of an episode; a
session can start with the episode's files (``start_with``) and have files copied out (``collect``).
Does not: parse calls, enforce the env's tool deadline, or cap the length of what the env sends
back (``ToolEnv`` does those).

The model's own failures (non-zero exit, its program timing out, too much output) are shown to
the model as text; only infrastructure failures (``SandboxError``) escape as exceptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

from agentrl.errors import ConfigError
from agentrl.sandbox.base import ExecResult, Sandbox, SandboxSession, supports_sessions


class Runner(Protocol):
    """What a tool needs: a ``Sandbox``, a ``SandboxSession`` or an ``EpisodeSandbox``."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        files: Mapping[str, bytes] | None = None,
    ) -> ExecResult: ...


_START_TIMEOUT_S = 10.0  # writing an episode's start files (a no-op program)
_CLOSING: set[asyncio.Task] = set()  # strong refs: a session being closed in the background


class EpisodeSandbox:
    """One-shot runs on ``sandbox``, or (``session=True``) every run of an episode in one session.

    ``end_episode()`` closes the session (sync: it is called from ``env.close()`` and ``reset``,
    which may run inside the event loop; the close is then scheduled on that loop)."""

    def __init__(self, sandbox: Sandbox, *, session: bool = False) -> None:
        if session and not supports_sessions(sandbox):
            raise ConfigError(
                f"session=True but the {getattr(sandbox, 'name', type(sandbox).__name__)!r} sandbox has no sessions"
            )
        self.sandbox, self.use_session = sandbox, session
        self._session: SandboxSession | None = None
        self._opening: asyncio.Lock | None = None
        self._start: dict[str, bytes] = {}  # written by the session's first run

    @property
    def persistent(self) -> bool:
        return self.use_session

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        files: Mapping[str, bytes] | None = None,
    ) -> ExecResult:
        if not self.use_session:
            return await self.sandbox.run(argv, stdin=stdin, timeout_s=timeout_s, files=files)
        if self._session is None:
            if self._opening is None:
                self._opening = asyncio.Lock()
            async with self._opening:  # two calls of one turn must not open two sessions
                if self._session is None:
                    session = await self.sandbox.session()
                    start, self._start = self._start, {}
                    if start:  # the episode's files, there before any call of the turn runs
                        try:
                            await session.run(["true"], timeout_s=_START_TIMEOUT_S, files=start)
                        except BaseException:
                            await session.close()
                            raise
                    self._session = session
        return await self._session.run(argv, stdin=stdin, timeout_s=timeout_s, files=files)

    def start_with(self, files: Mapping[str, bytes]) -> None:
        """The files this episode's session starts with (written at its first run; a session only)."""
        if not self.use_session:
            raise ConfigError("EpisodeSandbox.start_with needs session=True (one-shot runs keep no files)")
        self._start = dict(files)

    async def collect(self, paths: Sequence[str], *, timeout_s: float = 10.0) -> dict[str, bytes] | None:
        """Copy ``paths`` out of this episode's session (those it refuses are left out: see the sandbox
        contract); None when no session was opened this episode (no call ran: the files are those it
        would have started with)."""
        if self._session is None:
            return None
        return dict((await self._session.run(["true"], timeout_s=timeout_s, collect=paths)).files)

    def end_episode(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Close this episode's session, if one was opened. Outside a running loop the close runs
        to its end on ``loop`` (the env's private loop that opened it) or a new one."""
        session, self._session, self._opening, self._start = self._session, None, None, {}
        if session is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            if loop is not None and not loop.is_closed() and not loop.is_running():
                loop.run_until_complete(session.close())
            else:
                asyncio.run(session.close())
            return
        loop = running
        task = loop.create_task(session.close())
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)


def format_exec_result(res: ExecResult, timeout_s: float) -> str:
    """The text a model sees for one run: stdout, then stderr, then a status line when not clean."""
    parts = [p for p in (res.stdout, res.stderr) if p]
    text = "\n".join(p.rstrip("\n") for p in parts)
    notes = []
    if res.status == "timeout":
        notes.append(f"TimeoutError: the program did not finish within {timeout_s:g} s and was killed.")
    elif res.status == "output_limit":
        notes.append("[output limit exceeded: the program was killed; print less]")
    elif res.status == "oom":
        notes.append("MemoryError: the program ran out of memory and was killed.")
    elif res.status == "killed":
        notes.append(f"[the program was killed by signal {-(res.exit_code or 0)}]")
    elif res.status == "error":
        notes.append("[the sandbox reported an error running the program]")
    elif res.exit_code not in (0, None):
        notes.append(f"[exit code {res.exit_code}]")
    if res.truncated and res.status != "output_limit":
        notes.append("[output truncated]")
    if not text and not notes:
        return "(no output)"
    return "\n".join(([text] if text else []) + notes)


__all__ = ["EpisodeSandbox", "Runner", "format_exec_result"]
