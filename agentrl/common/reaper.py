"""Killing a process's server processes when that process (the owner) dies, however it dies.

An engine actor (or an ``agentrl run`` that launched its servers) starts each SGLang server in a
session (process group) of its own, so the server would outlive an owner that is SIGKILLed
(``ray.kill``, the OOM killer, a crashed node agent): nothing runs in the owner to stop it. ``Reaper`` starts a small
watchdog process, a child
of the actor in a session of its own, and keeps a pipe to its stdin. The actor writes the process
group of each server it starts (``watch``) and of each server it stops itself (``forget``); when
the pipe reaches EOF - the actor exited, cleanly or not, and the kernel closed its end - the
watchdog SIGTERMs, then SIGKILLs, every group still watched and exits. It blocks on the pipe, so
it costs no CPU, and it never needs the actor's pid (no pid-reuse race).

Run as a script (``python reaper.py``) it is the watchdog: this module imports only the standard
library at the top, so the watchdog starts in a few milliseconds and never imports agentrl.
Used by ``SGLangServer(reap_with_owner=True)`` (servers an engine launches) and the Ray engine actors
(``agentrl.distributed.sglang_engines``); does not start or supervise servers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

#: seconds between the SIGTERM and the SIGKILL of a watched group once its owner is gone
GRACE_S = 5.0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a group we may not signal is not ours to reap
        return False


def reap(groups: set[int], grace_s: float = GRACE_S) -> None:
    """SIGTERM every group in ``groups``, wait up to ``grace_s`` for them to go, SIGKILL the rest."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in list(groups):
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                groups.discard(g)
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and groups and time.monotonic() < deadline:
            groups = {g for g in groups if _group_alive(g)}
            time.sleep(0.1)


def _watchdog() -> None:
    groups: set[int] = set()
    for line in sys.stdin:  # ends at EOF: the owner closed the pipe or died
        word = line.strip()
        if word.lstrip("-").isdigit():
            pgid = int(word)
            if pgid > 0:
                groups.add(pgid)
            else:
                groups.discard(-pgid)
    reap(groups)


class Reaper:
    """The owner's end of one watchdog. ``watch(pgid)`` / ``forget(pgid)``; ``close()`` ends the
    watchdog without killing anything (forget the groups first) - or kills what it still watches."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        # the watchdog must not hold copies of other pipes of the owner; close_fds does that

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _send(self, pgid: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{pgid}\n".encode())
        self.proc.stdin.flush()

    def watch(self, pgid: int) -> None:
        """Kill process group ``pgid`` when the owner dies (unless forgotten first)."""
        self._send(int(pgid))

    def forget(self, pgid: int) -> None:
        """The owner stopped ``pgid`` itself: the watchdog must never signal that number again."""
        self._send(-int(pgid))

    def close(self, timeout_s: float = 30.0) -> None:
        """Close the pipe (the watchdog reaps what is still watched) and wait for it to exit."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # pragma: no cover - a watchdog stuck in reap()
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    _watchdog()
