"""What an SGLang engine needs of a server it supervises: :class:`ServerHandle`.

:class:`agentrl.engine.sglang.server.SGLangServer` (a process on this machine) has this shape, and so
does ``agentrl.distributed.sglang_engines.ActorServer`` (a server owned by a Ray actor); the engine and
its supervisor hold either through this Protocol. Launching (``start``, ``wait_ready``) is not part of
it: only :meth:`SGLangEngine.launch` does that, on the processes it creates itself."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class ServerHandle(Protocol):
    """A supervised SGLang server: where it listens, what it serves, how to probe, restart and stop it."""

    @property
    def url(self) -> str:
        """The base URL it listens at (changes when a restart finds its port taken)."""
        ...

    @property
    def model_path(self) -> str:
        """The model directory it was launched on."""
        ...

    @property
    def log_path(self) -> str | Path:
        """Its log file (named in warnings)."""
        ...

    def alive(self) -> bool:
        """Whether its process (or actor) still runs."""
        ...

    def restart(self, wait: bool = True) -> None:
        """Start it again (blocking; the engine runs it in a thread)."""
        ...

    def stop(self) -> None:
        """Stop it gracefully."""
        ...

    def kill(self) -> None:
        """Stop it at once."""
        ...
