"""Stand-ins beside the WeightSync seam: for tests of other parts, and of the SGLang paths' steps.

Owns :class:`FakeSync`, a WeightSync that checks and records each push and stamps the engine's new
version without moving a tensor, and :class:`FakeServerEngine`, the surface :class:`ServerSync`
drives on SGLangEngine (``urls``, ``post_all``, ``pause``, ``resume``, ``set_policy_version``,
``note_weights``) recording every call in order, with a failing admin path injectable. Neither
stands in for a real path or a real server in tests that claim to test one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.engine.base import named_tensors
from agentrl.errors import EngineError
from agentrl.weights.base import SyncStats, WeightSync, tensor_bytes


class FakeSync(WeightSync):
    """Checks ``state_dict`` as every path does, records ``(version, names)`` in :attr:`pushes` and
    sets the engine's policy version (``set_policy_version`` when offered, else the attribute).
    Versions in ``fail_versions`` raise EngineError instead (nothing recorded, version unchanged)."""

    name = "fake"

    def __init__(self, engine: Any, *, fail_versions: tuple[int, ...] = ()) -> None:
        super().__init__(engine)
        self.fail_versions = set(fail_versions)
        self.pushes: list[tuple[int, list[str]]] = []
        self.closed = False

    async def push(self, state_dict: Mapping[str, Any], version: int) -> SyncStats:
        t0 = time.perf_counter()
        named = named_tensors(state_dict)
        if version in self.fail_versions:
            raise EngineError(f"fake weight sync: push of version {version} fails (fail_versions)")
        setter = getattr(self.engine, "set_policy_version", None)
        if setter is not None:
            setter(version)
        else:
            self.engine.policy_version = version
        self.pushes.append((version, [n for n, _ in named]))
        return SyncStats(self.name, version, time.perf_counter() - t0, tensor_bytes(named))

    async def close(self) -> None:
        self.closed = True


class FakeServerEngine:
    """What the SGLang paths call on SGLangEngine, recorded in :attr:`calls` as tuples:
    ``("pause",)``, ``("post", path, payload)``, ``("version", v)``, ``("note", path, v)``,
    ``("resume",)``. ``post_all`` answers ``{"success": True}`` per URL, or raises EngineError naming
    the server for the path given as ``fail_path``."""

    def __init__(self, urls: tuple[str, ...] = ("http://fake-server:1",), *, fail_path: str | None = None) -> None:
        self.urls = list(urls)
        self.fail_path = fail_path
        self.calls: list[tuple] = []
        self.paused = False
        self.weights_path: str | None = None
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    def set_policy_version(self, v: int) -> None:
        self._version = int(v)
        self.calls.append(("version", int(v)))

    def note_weights(self, path: str | Path, version: int) -> None:
        self.weights_path = str(path)
        self.calls.append(("note", str(path), int(version)))

    async def post_all(self, path: str, payload: dict, *, timeout_s: float | None = None) -> list[dict]:
        self.calls.append(("post", path, payload))
        if path == self.fail_path:
            raise EngineError(f"SGLang server {self.urls[0]}: POST {path} -> HTTP 500: refused (fail_path)")
        return [{"success": True} for _ in self.urls]

    async def pause(self) -> None:
        self.paused = True
        self.calls.append(("pause",))

    async def resume(self) -> None:
        self.paused = False
        self.calls.append(("resume",))

    def posted(self) -> list[str]:
        """The admin paths posted so far, in order."""
        return [c[1] for c in self.calls if c[0] == "post"]
