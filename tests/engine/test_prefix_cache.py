"""PrefixCache (matching, LRU over sessions capped by tokens, epochs) and the prefill grouping plan."""

from __future__ import annotations

import pytest
import torch

from agentrl.engine.local_prefill import plan_groups
from agentrl.engine.prefix_cache import CachedPrefix, PrefixCache, common_prefix


def entry(ids) -> CachedPrefix:
    kv = torch.arange(len(ids), dtype=torch.float32).reshape(1, len(ids), 1)
    return CachedPrefix(tuple(ids), (kv,), (kv + 1,))


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([5], [1]) == 0
    assert common_prefix([], [1]) == 0


def test_match_full_partial_shorter_and_misses():
    c = PrefixCache(100)
    c.store("a", entry([1, 2, 3, 4, 5]), c.epoch)
    e, n = c.match("a", [1, 2, 3, 4, 5, 6, 7])  # the next turn: everything cached is reused
    assert e is not None and n == 5
    assert c.match("a", [1, 2, 9, 9])[1] == 2  # diverges mid-way
    assert c.match("a", [1, 2, 3])[1] == 2  # shorter: the last prompt token is always computed
    assert c.match("a", [1, 2, 3, 4, 5])[1] == 4  # equal to the cached ids: same rule
    assert c.match("a", [9, 1, 2]) == (None, 0)  # nothing shared
    assert c.match("a", [1]) == (None, 0)  # one token: nothing can be reused
    assert c.match("b", [1, 2, 3]) == (None, 0)  # unknown session
    assert c.match(None, [1, 2, 3]) == (None, 0)  # no session


def test_store_replaces_the_sessions_entry_and_counts_tokens():
    c = PrefixCache(100)
    c.store("a", entry([1, 2, 3]), 0)
    c.store("a", entry([1, 2, 3, 4, 5]), 0)
    assert len(c) == 1 and c.tokens == 5
    assert c.match("a", [1, 2, 3, 4, 5, 6])[1] == 5
    assert c.stats["evictions"] == 0


def test_lru_eviction_by_total_tokens():
    c = PrefixCache(10)
    c.store("a", entry(range(4)), 0)
    c.store("b", entry(range(4)), 0)
    c.match("a", [0, 1, 2, 3, 9])  # a is now the most recently used
    c.store("c", entry(range(4)), 0)  # 12 > 10: the least recently used (b) goes
    assert "b" not in c and "a" in c and "c" in c
    assert c.tokens == 8 and c.stats["evictions"] == 1
    c.store("d", entry(range(9)), 0)  # needs both others gone
    assert list(c._entries) == ["d"] and c.tokens == 9 and c.stats["evictions"] == 3


def test_an_entry_over_the_budget_is_not_kept_and_drops_the_old_one():
    c = PrefixCache(5)
    c.store("a", entry([1, 2, 3]), 0)
    c.store("a", entry(range(6)), 0)
    assert len(c) == 0 and c.tokens == 0 and c.stats["evictions"] == 0


def test_clear_starts_a_new_epoch_and_ignores_stale_stores():
    c = PrefixCache(100)
    c.store("a", entry([1, 2, 3]), 0)
    old = c.epoch
    c.clear()
    assert len(c) == 0 and c.tokens == 0 and c.epoch == old + 1 and c.stats["flushes"] == 1
    c.store("a", entry([1, 2, 3]), old)  # a request that was in flight across the weight update
    assert len(c) == 0
    c.store("a", entry([1, 2, 3]), c.epoch)
    assert len(c) == 1


def test_off_stores_nothing():
    c = PrefixCache(0)
    assert not c.enabled
    c.store("a", entry([1, 2, 3]), c.epoch)
    assert len(c) == 0 and c.match("a", [1, 2, 3, 4]) == (None, 0)


def test_note_reuse_counts_hits_and_tokens():
    c = PrefixCache(10)
    c.note_reuse(0)
    c.note_reuse(7)
    c.note_reuse(3)
    assert c.stats["hits"] == 2 and c.stats["tokens_reused"] == 10


def test_negative_budget_is_named():
    with pytest.raises(ValueError, match="-1"):
        PrefixCache(-1)


def test_plan_groups_misses_as_before_and_hits_by_new_tokens():
    lens = [10, 50, 20, 100, 300, 30]
    cached = [0, 0, 0, 95, 0, 25]  # requests 3 and 5 hit: 5 new tokens each
    groups = plan_groups(lens, cached, budget=120)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert groups == [[0, 2], [1], [4], [3, 5]]  # misses by length under rows*longest <= 120
    # hits with very different new tokens are not grouped (padding would be recomputed cache)
    assert plan_groups([100, 100], [95, 10], budget=10_000) == [[0], [1]]
    # similar ones are, within the budget
    assert plan_groups([100, 100, 100], [95, 94, 93], budget=14) == [[0, 1], [2]]
