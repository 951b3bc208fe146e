"""What the local engine's event-loop side hands its worker thread, and how answers get back.

Owns :class:`LocalRequest` (one generation in flight: prompt, limits, the tokens sampled so far,
the caller's loop and future), :class:`WeightUpdate` (a pending weight load), the check an update
passes before it is queued (:func:`check_update`: EngineError naming the bad value), the tokenizer
stop strings are decoded with (:func:`load_stop_tokenizer`), and :func:`deliver` / :func:`notify`,
which hand a result or a streamed token to the caller's event loop from the worker thread.

Does not run the model, sample or schedule (see :mod:`agentrl.engine.local.engine`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.engine.base import SamplingParams
from agentrl.errors import EngineError


@dataclass(eq=False)
class LocalRequest:
    """One generation: built on the event loop, advanced by the worker thread."""

    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    limit: int  # tokens it may generate: max_new_tokens, cut to fit max_context
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    generator: torch.Generator | None
    stop_strs: tuple[str, ...] = ()
    stop_window: int = 0  # sampled tokens decoded to look for a stop string
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    kv_len: int = 0  # tokens whose K/V are in the cache (the last sampled token is not, yet)
    reason: str = ""  # "stop" | "length" once finished
    done: bool = False
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    admitted_step: int = -1
    on_token: Callable[[int, float], None] | None = None  # generate_streaming's callback
    session: str | None = None  # the episode it belongs to: its K/V are kept for the next turn
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    cache_epoch: int = -1  # the prefix cache's epoch at prefill (another one: its K/V are stale)

    def hit_stop_string(self, tokenizer: Any) -> bool:
        """Whether the tail of the sampled ids, decoded, holds one of the stop strings. The tail
        is ``stop_window`` tokens: one per UTF-8 byte of the longest string, plus one."""
        tail = tokenizer.decode(self.tokens[-self.stop_window :])
        return any(s in tail for s in self.stop_strs)


@dataclass
class WeightUpdate:
    """A weight load waiting for the worker thread's next step."""

    state_dict: Mapping[str, Any]
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


def check_update(params: Mapping[str, torch.Tensor], state_dict: Mapping[str, Any]) -> None:
    """EngineError unless every tensor of ``state_dict`` names a model tensor of the same shape
    (all checked before anything is copied)."""
    for name, tensor in state_dict.items():
        if name not in params:
            raise EngineError(f"update_weights: unknown tensor {name!r}")
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise EngineError(
                f"update_weights: {name} has shape {tuple(tensor.shape)}, model has {tuple(params[name].shape)}"
            )


def load_stop_tokenizer(model_dir: str | None) -> Any:
    """The tokenizer of ``model_dir`` that stop strings are decoded with; EngineError naming the
    directory when none loads, or when there is no directory (an engine over an in-memory model)."""
    if model_dir is None:
        raise EngineError(
            "stop strings need a tokenizer: this LocalEngine was built from a loaded model; "
            "pass tokenizer= to LocalEngine"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:
        raise EngineError(
            f"stop strings need a tokenizer, and none loads from {model_dir}: {type(e).__name__}: {e}"
        ) from e


def _resolve(fut: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if fut.done():  # the caller was cancelled or already failed
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def deliver(
    loop: asyncio.AbstractEventLoop, fut: asyncio.Future, result: Any = None, error: BaseException | None = None
) -> None:
    """Resolve ``fut`` with ``result`` or ``error`` on ``loop`` (from any thread)."""
    try:
        loop.call_soon_threadsafe(_resolve, fut, result, error)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass


def notify(loop: asyncio.AbstractEventLoop, fn: Callable[[int, float], None], token: int, logprob: float) -> None:
    """Call ``fn(token, logprob)`` on ``loop`` (from any thread)."""
    try:
        loop.call_soon_threadsafe(fn, token, logprob)  # FIFO: every token's call runs before deliver's
    except RuntimeError:  # the caller's loop is closed: nobody is listening any more
        pass
