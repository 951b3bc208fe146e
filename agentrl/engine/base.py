"""The Engine seam: token ids in, sampled token ids + behaviour logprobs out.

Owns the interface every rollout engine implements (local HF engine, SGLang server, fakes), the
request/response records, :func:`check_prompt`, the check of a prompt's ids shared by engines, and
:func:`named_tensors`, the check of a weight update's state dict (HF names -> tensors) shared by
engines and weight syncs. Does not render chat or parse tool calls:
engines see only ids.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import EngineError


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one request. ``top_k=0`` and ``top_p=1.0`` disable those filters;
    ``temperature=0`` is greedy decoding (logprobs are still those of the temperature-1 softmax).

    ``stop`` holds stop strings: the request ends ("stop") at the first sampled token after which
    the decoded text of the sampled ids contains one of them. That token is kept, as sampled: the
    ids are never trimmed or re-tokenized, so the text may run a few characters past the string."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if isinstance(self.stop, str):
            raise ValueError(f"stop must be a sequence of strings, got the string {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))  # frozen: a list given by a caller becomes a tuple
        bad = [s for s in self.stop if not isinstance(s, str) or not s]
        if bad:
            raise ValueError(f"stop strings must be non-empty strings, got {bad[0]!r}")


@dataclass
class Generation:
    """One engine response. ``token_ids`` are exactly the sampled ids (the stop token, or the token
    that completed a stop string, included when finish_reason is "stop"); ``logprobs[i]`` is the behaviour logprob of
    ``token_ids[i]`` and
    ``versions[i]`` the policy version whose weights sampled it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop/eos id was sampled, or a stop string completed) | "length" | "abort"
    versions: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def check_prompt(prompt: Sequence[int], vocab: int | None, max_context: int | None) -> None:
    """EngineError unless ``prompt`` is non-empty, its ids are in ``[0, vocab)`` and it leaves room
    to generate within ``max_context`` (a limit that is None is not checked)."""
    if not prompt:
        raise EngineError("empty prompt: the engine needs at least one token to continue")
    bad = None if vocab is None else next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise EngineError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
    if max_context is not None and len(prompt) >= max_context:
        raise EngineError(f"prompt of {len(prompt)} tokens leaves no room to generate within max_context={max_context}")


def named_tensors(state_dict: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``state_dict`` as ``(name, detached tensor)`` pairs in its order. Raises EngineError when it is
    empty or a value is not a torch tensor (naming it)."""
    import torch

    if not state_dict:
        raise EngineError("weight sync: the state dict is empty")
    out = []
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise EngineError(f"weight sync: {name!r} is a {type(t).__name__}, not a tensor")
        out.append((str(name), t.detach()))
    return out


class Engine(abc.ABC):
    """A rollout engine. Implementations must be safe to call from thousands of concurrent
    coroutines on one event loop; batching is their business."""

    #: version of the weights currently served; every sampled token is stamped with it
    policy_version: int = 0

    @abc.abstractmethod
    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session: str | None = None
    ) -> Generation:
        """Continue ``prompt_ids``. Raises agentrl.errors.EngineError when the engine fails.

        ``session`` names the episode the request belongs to: engines with several servers send all
        requests of one session to the same server (its prefix cache then holds the episode so far);
        single-process engines ignore it."""

    async def generate_streaming(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        on_token: Callable[[int, float], None],
        *,
        session: str | None = None,
    ) -> Generation:
        """``generate`` that also calls ``on_token(token_id, logprob)`` on the caller's event loop for
        every sampled token, in order, before it returns. This default calls it for every token once
        the generation is done (engines that cannot stream); the local engine calls it per token as it
        is sampled. Cancelling the call cancels the generation."""
        g = await self.generate(prompt_ids, params, session=session)
        for t, lp in zip(g.token_ids, g.logprobs):
            on_token(t, lp)
        return g

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Load new weights in place and start stamping tokens with ``version``."""
        raise NotImplementedError(f"{type(self).__name__} cannot load weights")

    async def start(self) -> None:
        """Acquire resources (threads, servers). Idempotent."""

    async def close(self) -> None:
        """Release resources. In-flight requests fail with EngineError."""

    @property
    def max_context(self) -> int | None:
        """Longest prompt + completion the engine accepts, if it has a limit."""
        return None
