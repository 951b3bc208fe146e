"""Running the outside agent program of one episode: a shell command or a Python callable.

Owns: starting the program with the endpoint URL, its per-episode API key, the task and a result
path; the wall-clock limit (a command's whole process group is killed past it); and reading its
result (the result file's JSON object, else the last JSON-object line of stdout, or a callable's
return value) into a :class:`ProgramResult`; an env's work dir (:class:`Workspace`: the files the
program starts with, the paths copied back after it) for a program on the host, in a fresh
directory named by ``AGENTRL_WORKDIR`` (a callable: the task's ``workdir``). Does not record
completions or decide outcomes (:mod:`agentrl.agents.strategy`).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.sandbox.files import check_relpath, collect_files, write_files

_TAIL = 4000
_WORK_MAX = 64 << 20  # bytes copied into or out of a host workspace


@dataclass
class ProgramResult:
    """How one run of the agent program ended. ``error`` says why it failed (None: it exited 0)."""

    result: dict | None = None
    timed_out: bool = False
    error: str | None = None
    stdout: str = ""
    stderr: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # the workspace's collected files


@dataclass(frozen=True)
class Workspace:
    """An env's work dir for the agent program (reset's ``info["workspace"]``): ``files`` it starts
    with ({relative path: bytes}) and ``collect``, the paths copied back after the program ends."""

    files: dict[str, bytes]
    collect: tuple[str, ...]

    @classmethod
    def of(cls, info: dict) -> Workspace | None:
        """The workspace an env's reset ``info`` asks for (``{"files": {path: text}, "collect": [path]}``),
        or None; ValueError naming what is malformed."""
        ws = info.get("workspace")
        if ws is None:
            return None
        files, collect = ws.get("files") or {}, ws.get("collect") or []
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise ValueError(f"info['workspace']['files'] must map paths to text, got {files!r:.200}")
        if not isinstance(collect, list) or not all(isinstance(p, str) for p in collect):
            raise ValueError(f"info['workspace']['collect'] must be a list of paths, got {collect!r:.200}")
        for name in [*files, *collect]:
            check_relpath(name)
        return cls({k: v.encode("utf-8", "surrogatepass") for k, v in files.items()}, tuple(collect))


@contextmanager
def host_workdir(ws: Workspace | None, out: ProgramResult) -> Iterator[str | None]:
    """A fresh directory holding ``ws.files`` for a program on the host (None without a workspace);
    on exit, ``ws.collect`` is copied into ``out.files`` (escapes refused, as from a sandbox) and the
    directory removed."""
    if ws is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="agentrl-work-", ignore_cleanup_errors=True) as root:
        write_files(root, ws.files, max_total_bytes=_WORK_MAX)
        try:
            yield root
        finally:
            try:
                out.files = collect_files(root, ws.collect, max_file_bytes=_WORK_MAX, max_total_bytes=_WORK_MAX).files
            except OSError:  # the program removed or replaced the directory itself: nothing to collect
                out.files = {}


def reward_of(result: dict | None) -> float | None:
    """``result["reward"]`` as a float, or None when there is none (or it is not a finite number)."""
    value = (result or {}).get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        return None
    return float(value)


def last_json_line(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object, or None."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def program_env(base_url: str, api_key: str, task: dict, result_path: str) -> dict[str, str]:
    """The environment variables an agent program gets (on top of this process's): the endpoint for
    the `openai` client (``OPENAI_BASE_URL``, ending in ``/v1``) and the `anthropic` client
    (``ANTHROPIC_BASE_URL``, without it), the episode's key for both, the task and the result file."""
    return {
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": api_key,
        "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": api_key,
        "AGENTRL_TASK": json.dumps(task, ensure_ascii=False),
        "AGENTRL_RESULT": result_path,
    }


def load_callable(spec: str) -> Callable[..., Any]:
    """``"module:function"`` -> the function; ConfigError naming what is missing."""
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"agent.callable={spec!r} cannot be loaded: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise ConfigError(f"agent.callable={spec!r} is a {type(fn).__name__}, not a function")
    return fn


async def run_command(
    command: str, base_url: str, api_key: str, task: dict, timeout_s: float, workspace: Workspace | None = None
) -> ProgramResult:
    """Run ``command`` in a shell (its own process group) for one episode; with a ``workspace``, its
    directory is ``AGENTRL_WORKDIR`` (the program's current directory stays the trainer's)."""
    out = ProgramResult()
    with tempfile.TemporaryDirectory(prefix="agentrl-agent-") as tmp, host_workdir(workspace, out) as workdir:
        result_path = str(Path(tmp) / "result.json")
        env = {**os.environ, **program_env(base_url, api_key, task, result_path)}
        if workdir is not None:
            env["AGENTRL_WORKDIR"] = workdir
        proc = await asyncio.create_subprocess_shell(
            command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=env,
        )
        try:
            async with asyncio.timeout(timeout_s):
                stdout, stderr = await proc.communicate()
        except (TimeoutError, asyncio.CancelledError) as e:
            _kill_group(proc.pid)
            await proc.wait()
            if isinstance(e, asyncio.CancelledError):
                raise
            out.timed_out, out.error = True, f"the agent program ran past agent.timeout_s={timeout_s:g}s (killed)"
            return out
        finally:
            if proc.returncode is None:
                _kill_group(proc.pid)
        out.stdout = stdout.decode("utf-8", "replace")[-_TAIL:]
        out.stderr = stderr.decode("utf-8", "replace")[-_TAIL:]
        if proc.returncode != 0:
            out.error = f"the agent program exited with code {proc.returncode}: {out.stderr[-600:].strip()!r}"
        out.result = _read_result(result_path) or last_json_line(out.stdout)
        return out


def _read_result(path: str) -> dict | None:
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_callable(
    fn: Callable[..., Any],
    base_url: str,
    api_key: str,
    task: dict,
    timeout_s: float,
    workspace: Workspace | None = None,
) -> ProgramResult:
    """Call ``fn(task, base_url=..., api_key=...)``: awaited when async, else in a thread (a thread
    past the limit cannot be killed: it is abandoned and its episode ends). Whatever the function
    raises is its episode's error, a CancelledError that is not this task's cancellation included
    (one escaping would end the episode with no trajectory at all). With a ``workspace``, the task's
    ``workdir`` is its directory."""
    out = ProgramResult()
    with host_workdir(workspace, out) as workdir:
        if workdir is not None:
            task = {**task, "workdir": workdir}
        return await _call(fn, base_url, api_key, task, timeout_s, out)


async def _call(
    fn: Callable[..., Any], base_url: str, api_key: str, task: dict, timeout_s: float, out: ProgramResult
) -> ProgramResult:
    try:
        async with asyncio.timeout(timeout_s):
            if inspect.iscoroutinefunction(fn):
                value = await fn(task, base_url=base_url, api_key=api_key)
            else:
                value = await asyncio.to_thread(fn, task, base_url=base_url, api_key=api_key)
    except TimeoutError:
        out.timed_out, out.error = True, f"the agent callable ran past agent.timeout_s={timeout_s:g}s"
        return out
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # the episode or the run is being cancelled
        # raised inside the agent's own code (a library's cancel scope): its failure, not a cancellation
        out.error = "the agent callable raised CancelledError without being cancelled"
        return out
    except Exception as e:  # noqa: BLE001 - the agent's bug ends its episode, not the run
        out.error = f"the agent callable raised {type(e).__name__}: {e}"
        return out
    out.result = value if isinstance(value, dict) else None
    return out
