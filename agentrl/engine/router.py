"""Choosing a server for each request: least-loaded (fewest requests in flight), sticky per session.

Owns the per-server bookkeeping the choice needs (:class:`Backend`: URL, in-flight count, health,
a restart epoch and lock, counters for tests and metrics) and the session -> server map, a bounded
LRU so that an episode's turns reach the server whose prefix cache holds the episode so far.
Does not talk HTTP, probe health, or start and restart servers (``agentrl.engine.sglang.engine`` does).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

#: counters every Backend keeps (all start at 0)
COUNTERS = (
    "sent",  # /generate requests written to the server (re-sends included)
    "ok",  # answered with a generation
    "http_errors",  # answered with a non-200 status
    "connect_errors",  # never delivered: connection refused / connect timeout
    "lost",  # delivered, then the connection died before an answer (server crash)
    "resent",  # requests that this server received as their one re-send after a loss
    "restarts",  # times the engine restarted this (supervised) server
)


@dataclass(eq=False)
class Backend:
    """One server as the router sees it."""

    url: str
    index: int
    inflight: int = 0
    healthy: bool = True
    #: bumped by every restart: a failure seen at epoch e needs recovery only if the epoch is still e
    epoch: int = 0
    #: version string pushed to the server's ``weight_version`` (None: not pushed yet)
    pushed_version: str | None = None
    #: restarted without the current weights (no weights_path): keeps its own version label until
    #: the next weight load reaches it
    serves_stale: bool = False
    #: its last restart failed (only health checks try again)
    failed_restart: bool = False
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Router:
    """Least-loaded routing with session affinity over a fixed list of backends.

    ``pick(session)`` returns the session's server while it is healthy; a new session (or one whose
    server is down) goes to the healthy server with the fewest requests in flight, ties broken
    round-robin. At most ``max_sessions`` sessions are remembered (least recently used forgotten)."""

    def __init__(self, urls: Sequence[str], max_sessions: int = 100_000) -> None:
        if not urls:
            raise ValueError("the router needs at least one server URL")
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate server URLs: {list(urls)}")
        self.backends = [Backend(u.rstrip("/"), i) for i, u in enumerate(urls)]
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, Backend] = OrderedDict()
        self._rr = 0

    def pick(self, session: str | None = None, exclude: Collection[Backend] = ()) -> Backend:
        """The backend for the next request of ``session``. Never raises: when every backend is
        down or excluded it still returns one (the caller's request then fails on it and counts)."""
        pool = [b for b in self.backends if b.healthy and b not in exclude]
        if not pool:
            pool = [b for b in self.backends if b not in exclude] or self.backends
        if session is not None:
            b = self._sessions.get(session)
            if b is not None and b in pool:
                self._sessions.move_to_end(session)
                return b
        n = len(self.backends)
        self._rr = (self._rr + 1) % n
        b = min(pool, key=lambda x: (x.inflight, (x.index - self._rr) % n))
        if session is not None:
            self._sessions[session] = b
            self._sessions.move_to_end(session)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return b

    def forget(self, session: str) -> None:
        """Drop a finished session's affinity (optional: the LRU bound also does it)."""
        self._sessions.pop(session, None)

    def session_server(self, session: str) -> str | None:
        b = self._sessions.get(session)
        return None if b is None else b.url

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        for b in self.backends:
            for k, v in b.counts.items():
                out[k] += v
        return out
