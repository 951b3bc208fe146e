"""agentrl.common.ports: sockets bound before the number is known, EADDRINUSE as servers report it,
and whose listener a port is (issue 31: no pick-then-bind race)."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

import pytest

from agentrl.common.ports import addr_in_use, listener_is_ours, listening_socket


def test_a_listening_socket_on_port_0_is_bound_before_anyone_learns_its_port():
    with listening_socket() as sock:
        port = sock.getsockname()[1]
        assert port > 0
        with pytest.raises(OSError) as e:  # nobody can take it now: it is ours
            listening_socket(port=port)
        assert e.value.errno == errno.EADDRINUSE and addr_in_use(e.value)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # and it accepts: a server handed it serves at once


@pytest.mark.parametrize(
    "text",
    [
        # uvicorn, as SGLang's HTTP server dies of it
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 41234): address already in use",
        "OSError: [Errno 98] Address already in use",
        # torch's TCPStore (SGLang's nccl port)
        "The server socket has failed to listen on any local network address. port: 29500, code: -98, name: "
        "EADDRINUSE, message: address already in use",
        # SGLang's own checks of its derived ports
        "ValueError: nccl_port at 28761 is not available",
        "Port is already in use. dist_init_port=41235 port_base=41236",
    ],
)
def test_addr_in_use_finds_each_spelling_and_names_the_line(text):
    log = f"loading weights\n{text}\nshutting down\n"
    assert addr_in_use(log) == " ".join(text.split())[:300]


def test_addr_in_use_ignores_other_failures():
    assert addr_in_use("ValueError: config.json is not valid JSON\nexit 1") is None
    assert addr_in_use(OSError(errno.ECONNREFUSED, "Connection refused")) is None
    assert addr_in_use(OSError(errno.EADDRINUSE, "whatever the platform says"))


@pytest.mark.skipif(not os.path.isdir("/proc/net"), reason="listener ownership is read from /proc (Linux)")
def test_listener_is_ours_tells_our_session_from_another():
    with listening_socket() as mine:
        port = mine.getsockname()[1]
        assert listener_is_ours(port, os.getsid(0)) is True
    assert listener_is_ours(port, os.getsid(0)) is None  # nobody listens
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); time.sleep(60)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(other.stdout.readline())
        assert listener_is_ours(port, os.getsid(0)) is False  # a listener, but another session's
        assert listener_is_ours(port, other.pid) is True
    finally:
        other.kill()
        other.wait()
