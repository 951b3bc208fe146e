"""``agent.isolation``: a hostile agent program (hostile_agent.py) in the sandbox reaches nothing but its
own episode's endpoint -- not the host's files outside its view (the run dir, a key in HOME), not the
host's network, not the trainer's processes, environment or other listeners -- in every local mode
this host has; where the sandbox cannot isolate it the run says so; on the host (``host``) it gets
out, as before."""

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import pytest

import agentrl.jobs.rollout as rollout_job
from agentrl.agents.program import run_command
from agentrl.agents.sandboxed import SandboxedCommand, program_files
from agentrl.config.schema import load_config
from agentrl.errors import ConfigError
from agentrl.sandbox.base import Limits
from agentrl.sandbox.local.bwrap_view import bwrap_unavailable_reason

HOSTILE = Path(__file__).with_name("hostile_agent.py")
TASK = {"messages": [{"role": "user", "content": "hi"}], "tools": None, "task": {}}
ROOT = os.geteuid() == 0
MODES = {
    "root view": ({}, ROOT and bwrap_unavailable_reason() is None),
    "bwrap": ({"uid_base": None}, bwrap_unavailable_reason() is None),
    "namespaces without bwrap": ({"bwrap": False}, ROOT),
}


class FakeEndpoint:
    """An HTTP server on the host's loopback that answers every request 200 and keeps its
    Authorization header (stands in for the recording endpoint)."""

    def __init__(self) -> None:
        self.auth: list[str] = []

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def _serve(self, reader, writer):
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        headers = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
        await reader.readexactly(int(headers.get("Content-Length", 0)))
        self.auth.append(headers.get("Authorization", ""))
        body = b'{"ok": true}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()


@pytest.fixture
def targets(tmp_path, monkeypatch):
    """A run dir anyone may write and a key in a tmp HOME anyone may read: only the sandbox's view
    keeps the program from them."""
    tmp_path.chmod(0o755)
    run = tmp_path / "run"
    run.mkdir(mode=0o777)
    run.chmod(0o777)
    key = tmp_path / "home" / ".ssh" / "id_ed25519"
    key.parent.mkdir(parents=True)
    key.write_text("PRIVATE KEY\n")
    key.chmod(0o644)
    from agentrl.common.paths import cache_dir

    monkeypatch.setenv("AGENTRL_CACHE", str(cache_dir()))  # the built-in model stays where it is
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "s3cret")
    return run, key


def _hostile(run, key, port):
    return f"{sys.executable} {HOSTILE} {run} {key} {port}"


async def _run_sandboxed(run, key, options):
    async with FakeEndpoint() as ep:
        cmd = SandboxedCommand(_hostile(run, key, ep.port), options=options)
        res = await cmd.run(ep.url, "sk-episode-1", TASK, 60, Limits())
        return cmd, res, ep.auth


@pytest.mark.parametrize("mode", list(MODES))
def test_a_hostile_program_reaches_only_its_own_endpoint(mode, targets):
    options, possible = MODES[mode]
    if not possible:
        pytest.skip(f"{mode}: not possible on this host")
    run, key = targets
    cmd, res, auth = asyncio.run(_run_sandboxed(run, key, options))
    assert res.error is None and not res.timed_out, res
    assert res.result["escapes"] == [], res.result
    assert res.result["endpoint"] == 200 and auth == ["Bearer sk-episode-1"], (res.result, auth)
    assert not (run / "escaped.txt").exists()
    assert "reaches only its episode's endpoint" in cmd.isolation_line()


def test_where_the_network_cannot_be_isolated_the_run_says_so(targets):
    """No bubblewrap and no dedicated uid (as a user without bwrap): the program still reaches its
    endpoint, and the line the run prints says it is not isolated, naming the field."""
    run, key = targets
    cmd, res, _ = asyncio.run(_run_sandboxed(run, key, {"bwrap": False, "uid_base": None}))
    line = cmd.isolation_line()
    assert "cannot isolate" in line and "agent.isolation" in line and "\n" not in line, line
    assert res.error is None and res.result["endpoint"] == 200, res


def test_on_the_host_the_same_program_gets_out(targets):
    """agent.isolation=host: the old behaviour, for trusted programs only."""
    run, key = targets

    async def main():
        async with FakeEndpoint() as ep:
            return await run_command(_hostile(run, key, ep.port), ep.url, "sk-episode-1", TASK, 60)

    res = asyncio.run(main())
    escapes = res.result["escapes"]
    for what in ("write into the run dir", "read the secret key", "connect to the host's loopback port"):
        assert what in escapes, escapes
    assert "read the trainer's environment" in escapes and (run / "escaped.txt").exists()


def test_the_program_sees_its_script_and_not_its_other_arguments(tmp_path):
    script = tmp_path / "agents" / "loop.py"
    script.parent.mkdir()
    script.write_text("")
    other = tmp_path / "data.txt"
    other.write_text("")
    cmd, visible = program_files(f"{sys.executable} agents/loop.py --data {other}", str(tmp_path))
    assert cmd == f"{sys.executable} {script} --data {other}"
    assert visible == [str(script.parent)]
    _, visible = program_files("python -c 'print(1)'", str(tmp_path), files=["data.txt"])
    assert visible == [str(other)]
    with pytest.raises(ConfigError, match="agent.files"):
        program_files("python x.py", str(tmp_path), files=["missing.yaml"])


@pytest.mark.skipif(not ROOT, reason="the program runs as a dedicated uid only as root")
def test_a_script_the_sandbox_user_cannot_read_is_a_config_error(tmp_path):
    (tmp_path / "private").mkdir(mode=0o700)
    (tmp_path / "private" / "a.py").write_text("")
    with pytest.raises(ConfigError, match="agent.isolation"):
        SandboxedCommand(f"python {tmp_path / 'private' / 'a.py'}")


@pytest.mark.parametrize("isolation", ["sandbox", "host"])
def test_a_hostile_agent_in_a_rollout(isolation, targets, tmp_path):
    """End to end through the real recording endpoint: sandboxed (the default), every escape fails and
    the program's own requests are served and recorded; on the host it gets out."""
    run, key = targets
    with socket.socket() as host_port:
        host_port.bind(("127.0.0.1", 0))
        host_port.listen()
        lines = []
        cfg = load_config(
            [],
            [
                f"output_dir={run}",
                "env.id=code_exec",
                "agent.kind=proxy",
                f"agent.command={_hostile(run, key, host_port.getsockname()[1])}",
                f"agent.isolation={isolation}",
                "rollout.num_prompts=1",
                "rollout.group_size=2",
                "rollout.max_new_tokens=8",
            ],
        )
        trajs, _, out = rollout_job.run_rollout(cfg, progress=False, note=lines.append)
    results = [t.info["agent"]["result"] for t in trajs]
    assert len(results) == 2 and all(r and r["endpoint"] == 200 for r in results), results
    assert all(t.info["agent"]["requests"] == 1 for t in trajs)
    agent_line = [line for line in lines if line.startswith("agent: ")]
    if isolation == "sandbox":
        assert all(r["escapes"] == [] for r in results), results
        assert not (run / "escaped.txt").exists()
        assert "reaches only its episode's endpoint" in agent_line[0], lines
    else:
        assert all("read the secret key" in r["escapes"] for r in results), results
        assert "trusted programs only" in agent_line[0], lines
    assert json.loads((out / "metrics.json").read_text())["agent"]["program_crashes"] == 0
