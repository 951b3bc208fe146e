"""PrefixCache (matching, LRU over sessions and shared prompts capped by tokens, epochs) and the prefill
plans (grouping, which requests wait for another's shared prompt)."""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.engine.local.prefill import defer_followers, plan_groups, sharing_pays
from agentrl.engine.local.prefix_cache import CachedPrefix, PrefixCache, common_prefix


def entry(ids) -> CachedPrefix:
    kv = torch.arange(len(ids), dtype=torch.float32).reshape(1, len(ids), 1)
    return CachedPrefix(tuple(ids), (kv,), (kv + 1,))


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([5], [1]) == 0
    assert common_prefix([], [1]) == 0
    rng = random.Random(0)
    for _ in range(300):  # the bisection against the plain loop
        a = [rng.randrange(3) for _ in range(rng.randrange(40))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(40))]
        naive = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == common_prefix(tuple(a), tuple(b)) == naive, (a, b)


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


def test_shared_prompts_match_any_request_and_the_longest_wins():
    c = PrefixCache(100)
    system = [7, 7, 7, 7]
    c.share(entry(system + [1, 2, 3]), c.epoch)
    c.share(entry(system + [1, 2, 3]), c.epoch)  # the same ids again: kept once
    assert len(c) == 1 and c.tokens == 7 and c.stats["shared"] == 1
    e, n = c.match(None, system + [1, 2, 3, 4])  # no session needed
    assert n == 7 and e.ids == tuple(system + [1, 2, 3])
    assert c.match("x", system + [5, 5])[1] == 4  # another task: its system prompt is reused
    c.store("s", entry(system + [1, 2]), c.epoch)
    assert c.match("s", system + [1, 2, 3, 9])[0].ids == tuple(system + [1, 2, 3])  # longer shared wins
    assert c.match("s", system + [1, 2, 8])[0].ids == tuple(system + [1, 2])  # a tie: the session's own
    c.note_reuse(7, c.match(None, system + [1, 2, 3, 4])[0])
    c.note_reuse(6, c.match("s", system + [1, 2, 8])[0])
    assert c.stats["tokens_reused"] == 13 and c.stats["shared_tokens_reused"] == 7


def test_shared_prompts_share_the_budget_lru_and_epochs():
    c = PrefixCache(10)
    c.share(entry([1] * 6), c.epoch)
    c.store("s", entry([2] * 3), c.epoch)
    c.match(None, [1] * 6 + [3])  # the shared prompt is now the most recently used
    c.store("t", entry([4] * 3), c.epoch)  # 12 > 10: the session s goes, not the shared prompt
    assert "s" not in c and c.match(None, [1] * 7)[1] == 6 and c.stats["evictions"] == 1
    c.share(entry([5] * 11), c.epoch)  # over the whole budget: not kept
    assert c.stats["shared"] == 1
    stale = c.epoch
    c.clear()
    c.share(entry([1] * 6), stale)  # computed before a weight update
    assert len(c) == 0 and c.match(None, [1] * 7) == (None, 0)
    off = PrefixCache(0)
    off.share(entry([1] * 6), off.epoch)
    assert len(off) == 0


def test_defer_followers_prefills_each_shared_prefix_once():
    system = list(range(100, 140))  # 40 tokens every task starts with
    a, b = system + [1] * 50, system + [2] * 50
    prompts = [b, a, a, b, a, list(range(5, 60))]
    now, later = defer_followers(prompts, [0] * 6)
    assert now == [1, 5] and later == [0, 2, 3, 4]  # one of the system-prompt family, and the stranger
    # next round: a's prompt is cached (its siblings reuse all but the last token, b its system prompt)
    cached = {0: 40, 2: 89, 3: 40, 4: 89}
    now, later = defer_followers([prompts[i] for i in later], [cached[i] for i in later])
    assert now == [0, 1, 3] and later == [2]  # b's first, a's siblings; b's sibling waits for b
    # nothing to gain (short prefixes or already cached): nobody waits
    assert defer_followers([[1, 2, 3], [1, 2, 4]], [0, 0]) == ([0, 1], [])
    assert defer_followers([a, a], [89, 89]) == ([0, 1], [])
    assert defer_followers([a, a], [0, 0], min_gain=100) == ([0, 1], [])


def test_sharing_pays_for_a_new_kind_of_prompt_or_one_others_wait_for():
    system = list(range(100, 140))  # 40 tokens
    a, b = system + [1] * 50, system + [2] * 50
    assert sharing_pays(a, 0, [])  # nothing cached: it seeds the cache (the system prompt with it)
    assert not sharing_pays(a, 40, [])  # an eval's next task: its system prompt is cached already
    assert sharing_pays(a, 40, [b, a])  # a sibling waits for it
    assert not sharing_pays(a, 40, [b])  # b gains nothing beyond the cached system prompt
    assert not sharing_pays(a[:30], 0, [a])  # too short to be worth an entry
