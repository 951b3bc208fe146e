"""``agentrl sandbox ...``: see what a sandbox does with an input, build its image, list/clean containers.

Owns: the typer sub-app mounted by ``agentrl.cli.main`` as ``agentrl sandbox``. A thin shell: the work
is in ``agentrl.sandbox`` (``make_sandbox``), ``agentrl.sandbox.docker.image`` (``build_image``) and
``agentrl.sandbox.docker.daemon`` (``list_containers``, ``remove_containers``, ``remove_stale``).

Does not: keep anything running (``exec`` starts a sandbox, runs one program, and removes what it
started), or touch containers that lack the ``agentrl.sandbox`` label.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import sys
import time

import typer
from rich.console import Console
from rich.table import Table

from agentrl.cli.errors import fail as _fail
from agentrl.errors import AgentRLError, ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Sandboxed execution: run a program, build the Docker image, list/clean containers.",
)
console = Console()
#: Longest --timeout: a deadline is a number of seconds the program may run; beyond a day it is a typo
#: (and an unbounded one overflows the rlimits and timers it becomes).
MAX_TIMEOUT_S = 86400.0


def _docker_client():
    try:
        import docker

        return docker.from_env(timeout=30)
    except Exception as e:  # noqa: BLE001 - any way the daemon is unreachable is one clear error
        _fail(AgentRLError(f"no Docker daemon: {e}"))


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def exec_cmd(
    cmd: list[str] = typer.Argument(..., help="The program and its arguments (after `--`)."),
    backend: str = typer.Option("local", "--backend", "-b", help="local | docker | subprocess | auto."),
    timeout: float = typer.Option(10.0, "--timeout", "-t", help="Deadline in seconds."),
    memory: int | None = typer.Option(None, "--memory", "-m", help="Memory limit in MB (Limits.memory_mb)."),
    stdin_file: str | None = typer.Option(None, "--stdin", help="Feed this file on stdin ('-': our stdin)."),
    files: list[str] | None = typer.Option(None, "--file", "-f", help="NAME=PATH: copy a host file in (repeatable)."),
    collect: list[str] | None = typer.Option(None, "--collect", help="Copy this work-dir path out (repeatable)."),
    image: str | None = typer.Option(None, "--image", help="Docker image (docker backend)."),
) -> None:
    """Run CMD once in a sandbox and print the ExecResult as JSON (collected files base64)."""
    from agentrl.sandbox.base import Limits  # lazy: keeps CLI start light
    from agentrl.sandbox.factory import make_sandbox  # lazy: keeps CLI start light

    try:
        _check_args(timeout, memory)
        limits = Limits(memory_mb=memory) if memory is not None else Limits()
        options = {"limits": limits}
        if image is not None:
            options["image"] = image
        if backend == "docker":
            options["pool_size"] = 0  # one run: start exactly one container
        stdin = None
        if stdin_file == "-":
            stdin = sys.stdin.buffer.read()
        elif stdin_file is not None:
            stdin = _read_host_file(stdin_file, "--stdin")
        in_files = {}
        for spec in files or []:
            name, sep, path = spec.partition("=")
            if not sep:
                raise AgentRLError(f"--file takes NAME=PATH, got {spec!r}")
            in_files[name] = _read_host_file(path, f"--file {spec!r}:")
        sandbox = make_sandbox(backend, **options)
    except (AgentRLError, OSError, ValueError) as e:
        _fail(e)

    async def go():
        try:
            return await sandbox.run(
                list(cmd), stdin=stdin, timeout_s=timeout, files=in_files or None, collect=list(collect or ())
            )
        finally:
            await sandbox.aclose()

    try:
        res = asyncio.run(go())
    except (AgentRLError, ValueError) as e:
        _fail(e)
    out = dataclasses.asdict(res)
    out["files"] = {k: base64.b64encode(v).decode() for k, v in res.files.items()}
    out["backend"] = sandbox.name
    typer.echo(json.dumps(out, indent=2, ensure_ascii=False))


def _read_host_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:  # a directory, a missing or unreadable file: name the option and the path
        raise ConfigError(f"{what} {path!r}: {e.strerror or e}") from None


def _check_args(timeout: float, memory: int | None) -> None:
    import math

    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):
        raise ConfigError(f"--timeout {timeout!r}: must be a finite number of seconds in (0, {MAX_TIMEOUT_S:g}]")
    if memory is not None and memory <= 0:
        raise ConfigError(f"--memory {memory!r}: must be a positive number of MB (Limits.memory_mb)")


@app.command("build")
def build_cmd(
    tag: str | None = typer.Option(None, "--tag", help="Image tag (default agentrl-sandbox:latest)."),
    rootfs_cache: str | None = typer.Option(
        None, "--rootfs-cache", help="Keep the debootstrapped tree here and reuse it."
    ),
    mirror: str | None = typer.Option(None, "--mirror", help="Debian mirror (default http://deb.debian.org/debian)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if the image exists."),
) -> None:
    """Build the sandbox image offline: debootstrap a minimal Debian with python3, docker import."""
    from agentrl.sandbox.docker.image import DEFAULT_MIRROR, DEFAULT_TAG, build_image  # lazy: keeps CLI start light

    client = _docker_client()
    t0 = time.monotonic()
    try:
        build_image(
            client,
            tag=tag or DEFAULT_TAG,
            rootfs_cache=rootfs_cache,
            mirror=mirror or DEFAULT_MIRROR,
            force=force,
            log=lambda m: console.print(m, highlight=False),
        )
    except AgentRLError as e:
        _fail(e)
    console.print(f"done in {time.monotonic() - t0:.0f} s")


@app.command("ps")
def ps_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List sandbox containers (label agentrl.sandbox), with their owner process and limits."""
    from agentrl.sandbox.docker.daemon import list_containers, owner_alive  # lazy: keeps CLI start light

    rows = list_containers(_docker_client())
    for r in rows:
        alive = owner_alive(r["owner"])
        r["owner_alive"] = alive
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    tab = Table(title=f"{len(rows)} sandbox container(s)")
    for col in ("id", "status", "owner", "owner alive", "limits"):
        tab.add_column(col)
    for r in rows:
        tab.add_row(
            r["id"][:12], r["status"], r["owner"], {True: "yes", False: "no", None: "?"}[r["owner_alive"]], r["limits"]
        )
    console.print(tab)


@app.command("clean")
def clean_cmd(
    stale: bool = typer.Option(False, "--stale", help="Only containers whose owner process is gone."),
) -> None:
    """Remove sandbox containers (all of them, or only leaked ones with --stale)."""
    # lazy: keeps CLI start light
    from agentrl.sandbox.docker.daemon import list_containers, remove_containers, remove_stale

    client = _docker_client()
    n = remove_stale(client) if stale else remove_containers(client, [c["id"] for c in list_containers(client)])
    console.print(f"removed {n} sandbox container(s)")
