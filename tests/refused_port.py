"""A TCP port where connecting is refused for as long as a test needs it (a "server that is down").

Held bound but never listened on: connecting gets a refusal, and no other program can bind it
meanwhile (the socket has no SO_REUSEADDR). A port merely found free - bound, read, closed - can be
taken by another program before the test connects, which then answers instead of refusing.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def refused_port(host: str = "127.0.0.1") -> Iterator[int]:
    with socket.socket() as s:
        s.bind((host, 0))
        yield s.getsockname()[1]
