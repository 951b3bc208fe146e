"""The base of engines that wrap another engine: :class:`EngineWrapper`.

Owns the forwarding of the Engine seam (``generate``, ``update_weights``, ``start``, ``close``,
``policy_version``, ``max_context``) and of every other attribute (``pause``, ``post_all``,
``urls``, ...: what weight syncs and metrics call on a concrete engine) to ``inner``. A wrapper
subclasses it and overrides only what it changes (a gate, an injected delay, a log).

``generate_streaming`` is deliberately not forwarded: the Engine default runs ``self.generate``, so
a subclass that changes ``generate`` changes streaming too; forwarding it would let streamed
generations bypass the wrapper. A wrapper that wants the inner engine's per-token streaming
overrides it.

Does not: add behaviour of its own, or check the type of ``inner`` (wrappers that need a real
Engine say so in their own constructor).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.engine.base import Engine, Generation, SamplingParams


class EngineWrapper(Engine):
    """``inner``, forwarded; see the module docstring."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner

    @property
    def policy_version(self) -> int:  # type: ignore[override]
        return self.inner.policy_version

    @property
    def max_context(self) -> int | None:
        return self.inner.max_context

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session: str | None = None
    ) -> Generation:
        return await self.inner.generate(prompt_ids, params, session=session)

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        await self.inner.update_weights(state_dict, version)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the wrapper lacks: engine-specific calls of weight syncs and
        # metrics (pause, resume, post_all, urls, set_policy_version, server_stats, ...).
        if name == "inner":  # not set yet (during __init__ or unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
