"""One program run on a Docker sandbox container, as the host sees it.

Owns :func:`execute` (the request sent to the container's executor, the host-side deadline, a
stream that ends mid-run told apart as out-of-memory or a dead container), :func:`to_result` (the
executor's reply, untrusted, checked against what was asked and turned into an ``ExecResult``),
:func:`check_files` (files to copy in, checked before anything is sent) and :class:`SpawnError`.
Does not pick, reuse or replace containers (``pool``, ``sandbox``) or run anything inside one
(``agent.executor``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from agentrl.errors import SandboxError
from agentrl.sandbox.base import ExecResult, Limits
from agentrl.sandbox.docker.conn import ProtocolError
from agentrl.sandbox.docker.daemon import MB, Daemon
from agentrl.sandbox.docker.pool import Box
from agentrl.sandbox.files import check_relpath


async def execute(
    daemon: Daemon,
    box: Box,
    argv: list[str],
    stdin: bytes | None,
    timeout_s: float,
    files: Mapping[str, bytes] | None,
    collect: Sequence[str],
    *,
    env: dict[str, str],
    grace_s: float,
    reset: bool,
) -> tuple[ExecResult, bool, bool]:
    """Run ``argv`` on ``box``: (result, clean for reuse, container still alive). ``env`` is the
    program's whole environment; ``grace_s`` how long past ``timeout_s`` the host waits for the
    executor's reply before it raises SandboxError (the container is then destroyed)."""
    limits = box.limits
    files = dict(files or {})
    collect = list(collect)
    cap, max_file, max_total = limits.max_output_bytes, limits.fsize_mb * MB, limits.disk_mb * MB
    req = {
        "op": "run",
        "argv": argv,
        "env": env,
        "timeout": timeout_s,
        "cap": cap,
        "files": [[k, len(v)] for k, v in files.items()],
        "stdin": stdin is not None,
        "collect": collect,
        "max_file": max_file,
        "max_total": max_total,
        "reset": reset,
    }
    payload = b"".join(bytes(v) for v in files.values()) + (stdin or b"")
    # The host deadline also allows for moving the bytes (20 MB/s is slow even on a loaded machine).
    host_deadline = timeout_s + grace_s + (len(payload) + (max_total if collect else 0)) / 20e6
    t0 = time.perf_counter()
    try:
        reply, data = await asyncio.wait_for(
            box.conn.call(req, payload, max_payload=2 * cap + max_total), host_deadline
        )
    except TimeoutError:
        raise SandboxError(
            f"sandbox container {box.short}: no answer from its executor within the "
            f"{timeout_s:g} s deadline + {host_deadline - timeout_s:.1f} s; container destroyed"
        ) from None
    except (EOFError, ConnectionError, ProtocolError, OSError) as e:
        return await _died(daemon, box, e, t0), False, False
    wall = time.perf_counter() - t0
    return to_result(reply, data, wall, limits, collect, box), reply.get("clean") is True, True


async def _died(daemon: Daemon, box: Box, err: Exception, t0: float) -> ExecResult:
    """The stream ended mid-run. Out of memory (the kernel killed the executor too) is the
    program's doing: an ``oom`` result. Anything else (docker kill, daemon restart) is not. A
    container already removed is judged by the daemon's event log instead of its state."""
    state = await daemon.state(box.cid)
    oom = state.get("OOMKilled") if state is not None else await daemon.oom_event(box.cid, box.started)
    if oom:
        return ExecResult(
            "",
            "",
            -9,
            "oom",
            time.perf_counter() - t0,
            detail=f"the container ran out of memory ({box.limits.memory_mb} MB, work dir "
            "tmpfs included) and was destroyed",
        )
    how = "removed" if state is None else f"{state.get('Status')}, exit code {state.get('ExitCode')}"
    tail = box.conn.stderr_tail.decode(errors="replace").strip()[-300:]
    raise SandboxError(
        f"sandbox container {box.short} died during the run ({how}): {err}"
        + (f"; executor stderr: {tail}" if tail else "")
    )


class SpawnError(SandboxError):
    """The executor could not exec argv[0] (as on the local backend: infrastructure, not a result)."""


def check_files(files: Mapping[str, bytes] | None, limits: Limits) -> None:
    """TypeError/ValueError unless ``files`` are safe relative paths to bytes within ``limits.disk_mb``."""
    total = 0
    for name, data in (files or {}).items():
        check_relpath(name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"content of sandbox file {name!r} must be bytes, got {type(data).__name__}")
        total += len(data)
    if total > limits.disk_mb * MB:
        raise ValueError(f"files to copy in total {total} bytes, over the {limits.disk_mb * MB}-byte cap")


def to_result(reply: dict, data: bytes, wall: float, limits: Limits, collect: list[str], box: Box) -> ExecResult:
    """An executor reply as an ExecResult, checking it against what was asked (it is untrusted)."""
    status = reply.get("status")
    if status == "spawn_error":
        raise SpawnError(str(reply.get("error"))[:500])
    if status == "error":
        return ExecResult("", "", None, "error", wall, detail=str(reply.get("error"))[:1000])
    cap = limits.max_output_bytes
    n_out, n_err = reply.get("out"), reply.get("err")
    sizes = reply.get("files") or []
    ok_sizes = (
        isinstance(n_out, int)
        and isinstance(n_err, int)
        and 0 <= n_out <= cap
        and 0 <= n_err <= cap
        and all(
            isinstance(s, list)
            and len(s) == 2
            and s[0] in collect
            and isinstance(s[1], int)
            and 0 <= s[1] <= limits.fsize_mb * MB
            for s in sizes
        )
        and n_out + n_err + sum(s[1] for s in sizes) == len(data)
    )
    if status not in ("ok", "timeout", "output_limit") or not ok_sizes:
        raise SandboxError(f"sandbox container {box.short}: malformed reply from its executor: {reply!r:.300}")
    stdout, stderr = data[:n_out].decode("utf-8", "replace"), data[n_out : n_out + n_err].decode("utf-8", "replace")
    got, off = {}, n_out + n_err
    for name, size in sizes:
        got[name] = data[off : off + size]
        off += size
    code, sig, truncated = reply.get("exit_code"), reply.get("signal"), bool(reply.get("truncated"))
    details = []
    if status == "ok" and truncated:
        status = "output_limit"
    if status in ("timeout", "output_limit"):
        code = None
    elif reply.get("oom") and code != 0:
        status = "oom"
        details.append(f"killed by the kernel OOM killer at the {limits.memory_mb} MB memory limit")
    elif sig:
        status = "killed"
        details.append("file size limit (RLIMIT_FSIZE)" if sig == 25 else f"died by signal {sig}")
    elif code not in (0, None) and _last_line(stderr).startswith("MemoryError"):
        status = "oom"
        details.append(f"MemoryError under the {limits.memory_mb} MB limit")
    refused = reply.get("refused") or {}
    if isinstance(refused, dict) and refused:
        details.append("not collected: " + "; ".join(f"{p!r} ({why})" for p, why in refused.items()))
    if reply.get("clean") is False:
        details.append(f"container not reused: {reply.get('why')}")
    return ExecResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=code,
        status=status,
        wall_s=wall,
        truncated=truncated,
        files=got,
        detail="; ".join(details),
    )


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""
