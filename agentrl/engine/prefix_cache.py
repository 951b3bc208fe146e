"""The local engine's session-keyed prefix cache: the K/V of each episode's last request.

Owns :class:`PrefixCache`: per session (the ``session=`` an engine request carries, one per episode),
the token ids of its last finished request (prompt + sampled tokens whose K/V were computed) and
their per-layer K/V. The next turn of that episode starts with those ids plus the tokens the
environment appended, so the engine prefills only the new tokens on top of the cached K/V
(:meth:`PrefixCache.match` finds how many leading ids agree, a partial match included).

Memory is bounded by ``max_tokens`` (total cached tokens over all sessions): storing past the bound
evicts whole sessions, least recently used first; ``max_tokens=0`` turns the cache off. A weight
update makes every entry stale: :meth:`PrefixCache.clear` drops them all and starts a new epoch,
and a store computed under an older epoch (a request in flight across the update) is ignored.

Does not run the model or lay out K/V for a forward pass (see :mod:`agentrl.engine.local_prefill`),
share K/V across sessions (no radix tree: GRPO siblings sharing a prompt each prefill it once), or
lock: only the engine's worker thread calls it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, eq=False)
class CachedPrefix:
    """Token ids and the K/V computed for them: ``keys[layer]`` / ``values[layer]`` [heads, len(ids), dim]."""

    ids: tuple[int, ...]
    keys: tuple[Any, ...]
    values: tuple[Any, ...]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """LRU over sessions, capped by total cached tokens; counts hits, reused tokens, evictions."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"prefix cache max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = int(max_tokens)
        self.epoch = 0
        self.tokens = 0  # cached tokens over all sessions
        self._entries: OrderedDict[str, CachedPrefix] = OrderedDict()
        #: hits: requests that reused >= 1 cached token; tokens_reused: their sum; evictions: sessions
        #: dropped for room; flushes: clear() calls (weight updates)
        self.stats = {"hits": 0, "tokens_reused": 0, "evictions": 0, "flushes": 0}

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session: str) -> bool:
        return session in self._entries

    def match(self, session: str | None, prompt: Sequence[int]) -> tuple[CachedPrefix | None, int]:
        """The session's entry and how many of its leading tokens ``prompt`` can reuse: the ids both
        share, at most ``len(prompt) - 1`` (the last prompt token is always computed: its logits
        give the first sample). ``(None, 0)`` without a session or a shared token. Marks the
        session as recently used."""
        entry = self._entries.get(session) if session is not None else None
        if entry is None:
            return None, 0
        self._entries.move_to_end(session)
        n = min(common_prefix(entry.ids, prompt), len(prompt) - 1)
        return (entry, n) if n > 0 else (None, 0)

    def note_reuse(self, tokens: int) -> None:
        """Count a request that reused ``tokens`` cached tokens (0: not a hit)."""
        if tokens > 0:
            self.stats["hits"] += 1
            self.stats["tokens_reused"] += tokens

    def store(self, session: str, entry: CachedPrefix, epoch: int) -> None:
        """Keep ``entry`` as ``session``'s prefix (replacing its old one), then evict least recently
        used sessions until the total fits ``max_tokens``. Ignored when off or when ``epoch`` is not
        the current one (K/V computed before a weight update); an entry longer than the whole
        budget only drops the session's old one."""
        if not self.enabled or epoch != self.epoch:
            return
        self._drop(session)
        if len(entry.ids) > self.max_tokens:
            return
        self._entries[session] = entry
        self.tokens += len(entry.ids)
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))
            self.stats["evictions"] += 1

    def clear(self) -> None:
        """Drop every entry and start a new epoch (the weights changed: all K/V are stale)."""
        self._entries.clear()
        self.tokens = 0
        self.epoch += 1
        self.stats["flushes"] += 1

    def _drop(self, session: str) -> None:
        old = self._entries.pop(session, None)
        if old is not None:
            self.tokens -= len(old.ids)
