"""The local engine's prefix cache: the K/V of each episode's last request, and of shared prompts.

Owns :class:`PrefixCache`, two kinds of entries (token ids and their per-layer K/V):

- per session (the ``session=`` an engine request carries, one per episode): its last finished
  request (prompt + sampled tokens whose K/V were computed). The next turn of that episode starts
  with those ids plus the tokens the environment appended, so the engine prefills only the new
  tokens on top of the cached K/V.
- shared (:meth:`PrefixCache.share`): a prompt any request may start with. GRPO siblings share their
  whole first prompt and every task of an env shares its system prompt and tool block, so one
  prefill of those tokens serves them all.

:meth:`PrefixCache.match` finds, over the request's session entry and the shared ones, the entry
with the most leading ids in common with the prompt (a partial match included).

Memory is bounded by ``max_tokens`` (total cached tokens over all entries): storing past the bound
evicts whole entries, least recently used (stored or matched) first; ``max_tokens=0`` turns the
cache off. A weight update makes every entry stale: :meth:`PrefixCache.clear` drops them all and
starts a new epoch, and a store computed under an older epoch (a request in flight across the
update) is ignored.

Does not run the model or lay out K/V for a forward pass (see :mod:`agentrl.engine.local.prefill`),
decide which requests wait for another's prefill (``defer_followers`` there), keep a radix tree
(a shared entry is one whole prompt; a match is a linear scan over the shared entries, which the
token budget keeps few), or lock: only the engine's worker thread calls it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SHARED = "shared"  # the first half of a shared entry's key: (SHARED, its ids)


@dataclass(frozen=True, eq=False)
class CachedPrefix:
    """Token ids and the K/V computed for them: ``keys[layer]`` / ``values[layer]`` [heads, len(ids), dim]."""

    ids: tuple[int, ...]
    keys: tuple[Any, ...]
    values: tuple[Any, ...]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share (``a`` and ``b`` of one type: lists or tuples).
    A bisection over slice equality, so the comparisons run in C: O(n log n), not n Python steps."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:
        return n
    lo, hi = 1, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    """LRU over entries (sessions' and shared prompts'), capped by total cached tokens; counts hits,
    reused tokens (and those from shared entries), evictions."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"prefix cache max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = int(max_tokens)
        self.epoch = 0
        self.tokens = 0  # cached tokens over all sessions
        # keys: a session (str) or (SHARED, ids) for a shared prompt
        self._entries: OrderedDict[str | tuple, CachedPrefix] = OrderedDict()
        #: hits: requests that reused >= 1 cached token; tokens_reused: their sum; shared_tokens_reused:
        #: the part of it from shared entries; shared: shared entries stored; evictions: entries dropped
        #: for room; flushes: clear() calls (weight updates)
        self.stats = {
            "hits": 0,
            "tokens_reused": 0,
            "shared_tokens_reused": 0,
            "shared": 0,
            "evictions": 0,
            "flushes": 0,
        }

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session: str) -> bool:
        return session in self._entries

    def match(self, session: str | None, prompt: Sequence[int]) -> tuple[CachedPrefix | None, int]:
        """The entry ``prompt`` can reuse the most leading tokens of, among the session's entry and
        the shared ones, and how many: the ids both share, at most ``len(prompt) - 1`` (the last
        prompt token is always computed: its logits give the first sample). The session's entry
        wins ties. ``(None, 0)`` when nothing shares a token. Marks the entry as recently used."""
        ids = tuple(prompt)
        keys = [session] if session is not None and session in self._entries else []
        keys += [k for k in self._entries if isinstance(k, tuple)]
        best, n = None, 0
        for key in keys:
            m = common_prefix(self._entries[key].ids, ids)
            if m > n:
                best, n = key, m
        n = min(n, len(prompt) - 1)
        if best is None or n <= 0:
            return None, 0
        self._entries.move_to_end(best)
        return self._entries[best], n

    def note_reuse(self, tokens: int, entry: CachedPrefix | None = None) -> None:
        """Count a request that reused ``tokens`` cached tokens (0: not a hit) of ``entry``."""
        if tokens > 0:
            self.stats["hits"] += 1
            self.stats["tokens_reused"] += tokens
            if entry is not None and (SHARED, entry.ids) in self._entries:
                self.stats["shared_tokens_reused"] += tokens

    def store(self, session: str, entry: CachedPrefix, epoch: int) -> None:
        """Keep ``entry`` as ``session``'s prefix (replacing its old one), then evict least recently
        used sessions until the total fits ``max_tokens``. Ignored when off or when ``epoch`` is not
        the current one (K/V computed before a weight update); an entry longer than the whole
        budget only drops the session's old one."""
        if not self.enabled or epoch != self.epoch:
            return
        self._drop(session)
        self._put(session, entry)

    def share(self, entry: CachedPrefix, epoch: int) -> None:
        """Keep ``entry`` (a prompt's K/V) for any request to match, unless the same ids are kept
        already (then only marked as recently used); evicts as :meth:`store` does. Ignored when off
        or when ``epoch`` is not the current one."""
        if not self.enabled or epoch != self.epoch:
            return
        key = (SHARED, entry.ids)
        if key in self._entries:
            self._entries.move_to_end(key)
        elif self._put(key, entry):
            self.stats["shared"] += 1

    def _put(self, key: str | tuple, entry: CachedPrefix) -> bool:
        """Add ``entry`` under ``key`` and evict the least recently used entries until the total
        fits; an entry longer than the whole budget is not kept (False)."""
        if len(entry.ids) > self.max_tokens:
            return False
        self._entries[key] = entry
        self.tokens += len(entry.ids)
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))
            self.stats["evictions"] += 1
        return True

    def clear(self) -> None:
        """Drop every entry and start a new epoch (the weights changed: all K/V are stale)."""
        self._entries.clear()
        self.tokens = 0
        self.epoch += 1
        self.stats["flushes"] += 1

    def _drop(self, key: str | tuple) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.tokens -= len(old.ids)
