"""The local backend's way out for a caller that wants one: ``run(pass_fd=...)`` gives the program one
descriptor (its number in ``$AGENTRL_PASS_FD``), ``loopback=True`` lets it use 127.0.0.1 inside its own
network namespace and nothing outside, ``visible`` shows a host directory read-only -- in every local
mode this host has."""

import asyncio
import os
import socket
import sys

import pytest

from agentrl.sandbox.local import LocalSandbox
from agentrl.sandbox.local.bwrap_view import bwrap_unavailable_reason
from agentrl.sandbox.subprocess_runner import SubprocessSandbox

ROOT = os.geteuid() == 0
BWRAP = bwrap_unavailable_reason() is None
MODES = {
    "root view": ({}, ROOT and BWRAP),
    "bwrap": ({"uid_base": None}, BWRAP),
    "namespaces without bwrap": ({"bwrap": False}, ROOT),
}
PROGRAM = r"""
import os, socket, sys
out = socket.socket(fileno=int(os.environ["AGENTRL_PASS_FD"]))
out.send(b"through the passed descriptor")
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
socket.create_connection(listener.getsockname(), timeout=2).close()
print(open(os.path.join(sys.argv[1], "seen.txt")).read())
try:
    open(os.path.join(sys.argv[1], "written.txt"), "w")
    print("WROTE")
except OSError:
    pass
try:
    socket.create_connection(("192.0.2.1", 80), timeout=1)
    print("NETWORK")
except OSError:
    pass
"""


async def _run(sandbox, seen_dir):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        res = await sandbox.run([sys.executable, "-c", PROGRAM, str(seen_dir)], timeout_s=30, pass_fd=theirs.fileno())
        ours.settimeout(5)
        return res, ours.recv(100)


@pytest.mark.parametrize("mode", list(MODES))
def test_one_descriptor_loopback_and_a_visible_dir(mode, tmp_path):
    options, possible = MODES[mode]
    if not possible:
        pytest.skip(f"{mode}: not possible on this host")
    tmp_path.chmod(0o755)
    (tmp_path / "seen.txt").write_text("visible")
    sandbox = LocalSandbox(visible=[str(tmp_path)], loopback=True, **options)
    res, got = asyncio.run(_run(sandbox, tmp_path))
    assert res.ok, res
    assert got == b"through the passed descriptor"
    assert res.stdout.split() == ["visible"], res.stdout  # read-only, no network
    assert sandbox.describe()["loopback"] and sandbox.describe()["visible"] == [str(tmp_path)]


def test_the_plain_runner_passes_the_descriptor_too(tmp_path):
    (tmp_path / "seen.txt").write_text("visible")
    res, got = asyncio.run(_run(SubprocessSandbox(), tmp_path))
    assert res.ok and got == b"through the passed descriptor", res
