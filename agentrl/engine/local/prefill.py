"""The local engine's batched prefill, on top of cached prefixes.

Owns how admitted requests are grouped into prefill forwards (:func:`plan_groups`) and the tensors
of one such forward (:func:`build_prefill`): each row's prompt may start with ``cached`` tokens whose
K/V the prefix cache holds (:mod:`agentrl.engine.local.prefix_cache`); only the rest are fed to the model,
at their true positions, attending to the cached K/V through :class:`PastCache` (a duck-typed HF
cache that prepends them). A group feeds every row the same number ``P`` of query tokens (the most
new tokens of any row): a row with fewer new tokens re-feeds its last cached ones (their K/V are
recomputed, equal up to float rounding), a row shorter than ``P`` is left-padded. Without cached
tokens this is the plain left-padded prefill from empty.

Layout of one row over the ``Q + P`` columns the forward leaves in the cache (``Q``: the most cached
tokens any row reuses): ``[pad | reused cached K/V | pad]`` then ``[pad | query tokens]``, where a
row that reuses anything has no query padding, so its valid columns are contiguous and end at the
last one, as :class:`agentrl.engine.local.kv_batch.KVBatch` wants.

Which requests prefill now and which wait a round for another's (:func:`defer_followers`): requests
admitted together often share long prefixes the cache does not hold yet (GRPO siblings their whole
prompt, every task its system prompt and tool block); one of them prefills first, its prompt's K/V
are shared (:meth:`agentrl.engine.local.prefix_cache.PrefixCache.share`), and the others reuse them.
Which prompts are worth sharing (:func:`sharing_pays`): a new kind, or one others wait for.

Does not run the model, sample or pick what to reuse (see :mod:`agentrl.engine.local.engine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.engine.local.kv_batch import additive_mask
from agentrl.engine.local.prefix_cache import CachedPrefix, common_prefix

#: a request waits for another's prefill only to reuse at least this many more tokens
MIN_SHARED_TOKENS = 32


def defer_followers(
    prompts: Sequence[Sequence[int]], cached: Sequence[int], min_gain: int = MIN_SHARED_TOKENS
) -> tuple[list[int], list[int]]:
    """Split requests into (prefill now, wait a round), as index lists. In lexicographic order of
    the prompts, a request waits when it shares at least ``min_gain`` more leading tokens with the
    request before it than the cache gives it (``cached``): once that one's prompt is shared, it
    reuses them. The first request in that order never waits, so every round makes progress, and
    identical prompts are computed once: siblings wait for the first of them."""
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    now, later = [], []
    for j, i in enumerate(order):
        shared = common_prefix(list(prompts[order[j - 1]]), list(prompts[i])) if j else 0
        (later if min(shared, len(prompts[i]) - 1) - cached[i] >= min_gain else now).append(i)
    return sorted(now), sorted(later)


def sharing_pays(
    prompt: Sequence[int], cached: int, waiting: Sequence[Sequence[int]], min_gain: int = MIN_SHARED_TOKENS
) -> bool:
    """Whether a prompt about to be prefilled is worth keeping as a shared entry: the cache holds
    fewer than ``min_gain`` of its leading tokens (``cached``: a new kind of prompt, e.g. the first
    with this system prompt), or a request ``waiting`` for a later round would reuse at least
    ``min_gain`` more tokens of it. Other prompts (an eval's tasks after the first: all they share is
    already cached) would only push useful entries out of the token budget."""
    if len(prompt) - cached < min_gain:
        return False
    if cached < min_gain:
        return True
    return any(common_prefix(list(prompt), list(w)) - cached >= min_gain for w in waiting)


def plan_groups(prompt_lens: Sequence[int], cached: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of the requests, in prefill groups. Requests without cached tokens are grouped as
    before the cache existed: sorted by length, a group growing while ``rows * longest <= budget``.
    Requests with cached tokens are sorted by new tokens and grouped under the same bound, and a
    group stops growing once its padding would exceed half its new tokens (each padded query
    token of a row with a cache hit is a cached token computed again)."""
    misses = sorted((i for i, c in enumerate(cached) if c == 0), key=lambda i: prompt_lens[i])
    hits = sorted((i for i, c in enumerate(cached) if c > 0), key=lambda i: prompt_lens[i] - cached[i])
    groups = _greedy(misses, [prompt_lens[i] for i in misses], budget, waste=False)
    return groups + _greedy(hits, [prompt_lens[i] - cached[i] for i in hits], budget, waste=True)


def _greedy(order: list[int], sizes: list[int], budget: int, *, waste: bool) -> list[list[int]]:
    """Consecutive runs of ``order`` (``sizes`` ascending) as groups under the bounds above."""
    groups: list[list[int]] = []
    group: list[int] = []
    total = 0
    for i, n in zip(order, sizes):
        rows = len(group) + 1
        fits = rows * n <= budget and (not waste or 2 * rows * n <= 3 * (total + n))
        if group and not fits:
            groups.append(group)
            group, total = [], 0
        group.append(i)
        total += n
    if group:
        groups.append(group)
    return groups


class PastCache:
    """Duck-typed HF cache for one prefill forward: layer ``i``'s new K/V are appended to
    ``past_keys[i]`` / ``past_values[i]`` ([rows, heads, Q, dim]; none when ``Q == 0``) and kept,
    whole, in :attr:`keys` / :attr:`values`."""

    def __init__(self, past_keys: list[torch.Tensor] | None = None, past_values: list[torch.Tensor] | None = None):
        self.past_keys, self.past_values = past_keys, past_values
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.past_keys is not None and self.past_values is not None:  # given together
            key_states = torch.cat([self.past_keys[layer_idx], key_states], dim=2)
            value_states = torch.cat([self.past_values[layer_idx], value_states], dim=2)
        self.keys[layer_idx], self.values[layer_idx] = key_states, value_states
        return key_states, value_states


@dataclass
class PrefillBatch:
    """The inputs of one prefill forward and what the engine keeps from it."""

    ids: torch.Tensor  # [k, P] query tokens, left-padded
    pos: torch.Tensor  # [k, P] their positions in the sequence (pads: 0)
    mask: torch.Tensor  # [k, 1, P, Q + P] additive attention mask
    valid: torch.Tensor  # [k, Q + P] columns of the resulting K/V that hold tokens
    cache: PastCache
    reused: list[int]  # cached tokens each row reuses (not computed again)


def build_prefill(
    prompts: Sequence[Sequence[int]],
    prefixes: Sequence[CachedPrefix | None],
    cached: Sequence[int],
    dtype: torch.dtype,
) -> PrefillBatch:
    """The forward of one group: ``prompts[i]`` whose first ``cached[i]`` tokens have K/V in
    ``prefixes[i]`` (``cached[i] == 0``: none). See the module docstring for the layout."""
    k = len(prompts)
    lens = [len(p) for p in prompts]
    p = max(n - c for n, c in zip(lens, cached))
    reused = [min(c, max(0, n - p)) for n, c in zip(lens, cached)]
    q = max(reused)
    ids = torch.zeros(k, p, dtype=torch.long)
    query_valid = torch.zeros(k, p, dtype=torch.bool)
    for i, (prompt, u) in enumerate(zip(prompts, reused)):
        fed = prompt[u:]
        ids[i, p - len(fed) :] = torch.tensor(list(fed), dtype=torch.long)
        query_valid[i, p - len(fed) :] = True
    pos = (torch.tensor(lens)[:, None] - p + torch.arange(p)[None, :]).clamp_(min=0)
    past_valid = torch.zeros(k, q, dtype=torch.bool)
    for i, u in enumerate(reused):
        past_valid[i, q - u :] = True
    causal = torch.ones(p, p, dtype=torch.bool).tril_()
    eye = torch.eye(p, dtype=torch.bool)
    # Padding queries may see themselves: a fully masked row would give NaN, and NaN survives masking.
    own = causal[None] & (query_valid[:, None, :] | eye[None])
    allowed = torch.cat([past_valid[:, None, :].expand(k, p, q), own], dim=-1)
    cache = PastCache(*_past(prefixes, reused, q)) if q > 0 else PastCache()
    return PrefillBatch(
        ids=ids,
        pos=pos,
        mask=additive_mask(allowed, dtype)[:, None],
        valid=torch.cat([past_valid, query_valid], dim=1),
        cache=cache,
        reused=reused,
    )


def _past(
    prefixes: Sequence[CachedPrefix | None], reused: Sequence[int], q: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer [k, heads, q, dim]: each row's first ``reused[i]`` cached K/V, right-aligned,
    zeros elsewhere (zeros, not empty memory: NaN at masked columns would poison attention)."""
    ref = next(pre for pre, u in zip(prefixes, reused) if u > 0)
    assert ref is not None  # a row reuses cached tokens only from its prefix
    out: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
    for side, bufs in ((0, ref.keys), (1, ref.values)):
        for layer, t in enumerate(bufs):
            past = t.new_zeros(len(reused), t.shape[0], q, t.shape[2])
            for i, (pre, u) in enumerate(zip(prefixes, reused)):
                if u > 0:
                    assert pre is not None  # as ref
                    src = pre.keys[layer] if side == 0 else pre.values[layer]
                    past[i, :, q - u :] = src[:, :u]
            out[side].append(past)
    return out
