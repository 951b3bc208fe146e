"""The agent program inside the sandbox (``agent.isolation: sandbox``, the default for ``agent.command``).

Owns: :class:`SandboxedCommand`, which runs ``agent.command`` once per episode in a local sandbox
(:class:`~agentrl.sandbox.local.LocalSandbox`: rlimits, a dedicated uid, its own pid, mount and
network namespaces and bubblewrap's read-only view, as far as this host allows; the limits of the
env's tool calls) through the launcher :mod:`agentrl.agents.relay`, whose only way out is the
episode's :class:`~agentrl.agents.bridge.EndpointBridge`; what the program may see of the host
(:func:`program_files`: the trainer's Python and its packages, read-only, and the command's
script's directory); and the one line that says how isolated it is (:meth:`isolation_line`),
honest where this host cannot isolate its network.

Always the local sandbox, whatever backend the env's tool calls use: a Docker container cannot
carry the trainer's Python and its packages (the program's ``openai``, ``anthropic``, litellm,
...), so ``agent.isolation: sandbox`` never runs the program there.

Does not: start the endpoint or decide outcomes (:mod:`agentrl.agents.strategy`), run programs
on the host (:mod:`agentrl.agents.program`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlparse

from agentrl.agents.bridge import EndpointBridge
from agentrl.agents.program import ProgramResult, Workspace, last_json_line
from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox.base import Limits
from agentrl.sandbox.local import LocalSandbox
from agentrl.sandbox.probe import docker_unavailable_reason
from agentrl.sandbox.subprocess_runner import SubprocessSandbox

_TAIL = 4000
_LAUNCHER = Path(__file__).with_name("relay.py")
_OUTPUT = 4 << 20  # the launcher prints one JSON line: the program's tails and its result file
_SAFE_WORD = re.compile(r"[\w@%+=:,./-]+")  # a word the shell passes through unchanged


def _system_paths() -> tuple[str, ...]:
    """Where the sandbox shows the host anyway: a path under one is no program file of its own."""
    pythons = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/etc/", *(p.rstrip("/") + "/" for p in pythons))


def program_files(command: str, cwd: str, files: Sequence[str] = ()) -> tuple[str, list[str]]:
    """``command`` with its script's path made absolute, and the host paths the program is shown
    (read-only, at their own paths): the directory of the command's first word that names a file
    (relative to ``cwd`` or absolute; the interpreter and anything under ``/usr`` or the trainer's
    Python are shown anyway), and ``files`` (``agent.files``). Only plain words count (no quotes,
    no ``$``): the rest of the command's arguments stay out of the sandbox's view."""
    system = _system_paths()
    words = re.split(r"(\s+)", command)
    visible: list[str] = []
    for i, word in enumerate(words):
        if not word or word.isspace() or not _SAFE_WORD.fullmatch(word):
            continue
        path = Path(cwd, word)
        if not path.is_file():
            continue
        real = os.path.realpath(path)
        if real.startswith(system):
            continue
        words[i] = shlex.quote(real)
        visible.append(os.path.dirname(real))
        break
    for f in files:
        p = Path(cwd, f)
        if not p.exists():
            raise ConfigError(f"agent.files: {f!r} does not exist (relative paths are to {cwd})")
        visible.append(os.path.realpath(p))
    return "".join(words), list(dict.fromkeys(visible))


class SandboxedCommand:
    """``agent.command`` in the local sandbox, one run per episode (see the module docstring): a
    LocalSandbox showing :func:`program_files`, with its network namespace's loopback up (for the
    launcher's listener); ``options``: more of its options (tests: ``bwrap``, ``uid_base``)."""

    def __init__(
        self, command: str, *, files: Sequence[str] = (), cwd: str | None = None, options: dict | None = None
    ) -> None:
        self.command, visible = program_files(command, cwd or os.getcwd(), files)
        options = {"max_concurrency": 4096, **(options or {})}
        self.sandbox: SubprocessSandbox = LocalSandbox(visible=visible, loopback=True, **options)
        self._launcher = _LAUNCHER.read_text()
        self.visible = visible
        self._check_readable()

    def _check_readable(self) -> None:
        """As root the program runs as a dedicated uid: a directory it cannot read is a config error
        now, not a crash in every episode."""
        if getattr(self.sandbox, "uid_base", None) is None:
            return
        for path in self.visible:
            mode = os.stat(path).st_mode
            need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
            if mode & need != need:
                raise ConfigError(
                    f"agent.isolation=sandbox: the agent program runs as an unprivileged user, which cannot read "
                    f"{path!r} (mode {stat.filemode(mode)}): make it world-readable (chmod o+rx), or set "
                    "agent.isolation: host to run a trusted program on the host"
                )

    def describe(self) -> dict:
        d = getattr(self.sandbox, "describe", None)
        return d() if d is not None else {"network_isolated": False}

    def isolation_line(self) -> str:
        """One line for the run's start: where the agent program runs and what it can reach."""
        d = self.describe()
        if not d.get("network_isolated"):
            why = d.get("bwrap_reason") or "no network namespace"
            return (
                f"agent: agent.isolation=sandbox cannot isolate the agent program here (bubblewrap: {why}; no "
                "namespaces of our own without root): it runs as you, with your network and files; install "
                "bubblewrap or run as root, or set agent.isolation: host to say you trust it"
            )
        line = (
            f"agent: agent.command runs in the sandbox ({self.sandbox.isolation_summary().split(';')[0]}); "
            "it reaches only its episode's endpoint"
        )
        if docker_unavailable_reason() is None:  # the env's tool calls may well run in Docker: say why not this
            line += " (the local sandbox even where tools use Docker: no image carries the trainer's Python packages)"
        return line

    async def run(
        self,
        base_url: str,
        api_key: str,
        task: dict,
        timeout_s: float,
        limits: Limits,
        workspace: Workspace | None = None,
    ) -> ProgramResult:
        """One episode: the program with the endpoint at ``base_url`` bridged in, ``limits`` (the
        env's tool calls'; the output cap is the launcher's) and ``timeout_s`` (``agent.timeout_s``).
        A ``workspace``'s files are written into the program's work dir (its current directory and
        ``AGENTRL_WORKDIR``, where the commands it runs execute) and its ``collect`` paths copied out
        after the program (and all it started) ended, refused escapes left out (the sandbox contract)."""
        url = urlparse(base_url)
        spec = {
            "command": self.command,
            "env": {
                "OPENAI_API_KEY": api_key,
                "ANTHROPIC_API_KEY": api_key,
                "AGENTRL_TASK": json.dumps(task, ensure_ascii=False),
            },
        }
        out = ProgramResult()
        async with EndpointBridge(url.hostname or "127.0.0.1", url.port or 80) as bridge:
            try:
                res = await self.sandbox.run(
                    [sys.executable, "-I", "-c", self._launcher],
                    stdin=json.dumps(spec).encode(),
                    timeout_s=timeout_s,
                    limits=replace(limits, max_output_bytes=max(limits.max_output_bytes, _OUTPUT)),
                    pass_fd=bridge.fd,
                    files=workspace.files if workspace else None,
                    collect=workspace.collect if workspace else (),
                )
            except SandboxError as e:
                out.error = f"the agent sandbox failed: {e}"
                return out
        if res.status == "timeout":
            out.timed_out, out.error = True, f"the agent program ran past agent.timeout_s={timeout_s:g}s (killed)"
            return out
        report = last_json_line(res.stdout)
        if res.status != "ok" or not report or report.get("agentrl_relay") != 1:
            why = res.detail or f"status {res.status}, exit code {res.exit_code}"
            out.error = f"the agent program's sandbox ended it ({why}): {res.stderr[-600:].strip()!r}"
            out.stderr = res.stderr[-_TAIL:]
            return out
        out.files = dict(res.files)
        out.stdout = str(report.get("stdout") or "")[-_TAIL:]
        out.stderr = str(report.get("stderr") or "")[-_TAIL:]
        code = report.get("exit")
        if code != 0:
            out.error = f"the agent program exited with code {code}: {out.stderr[-600:].strip()!r}"
        out.result = _parse(report.get("result")) or last_json_line(out.stdout)
        return out

    async def aclose(self) -> None:
        await self.sandbox.aclose()


def _parse(text: object) -> dict | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
