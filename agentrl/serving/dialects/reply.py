"""The chat core's answer as a dialect sees it: one :class:`Reply` and the events of a stream.

Every dialect (:mod:`agentrl.serving.dialects`) is served by the one chat core,
:meth:`agentrl.serving.api.OpenAIAPI.chat`, which answers OpenAI chat bodies with a
``chat.completion`` dict or a stream of ``chat.completion.chunk`` dicts. This module reads both
back into dialect-neutral terms: :class:`Reply` (the reply's text, its tool calls, why it ended,
the token counts and the ``agentrl`` record of the sampled ids) and, for a stream,
:func:`reply_events` (``("text", delta)``, ``("call", call)``, ``("end", None)``,
``("error", APIError)``), filling a :class:`Reply` as the events pass.

Does not: know any dialect's shapes (:mod:`agentrl.serving.dialects.anthropic`,
:mod:`agentrl.serving.dialects.responses`) or sample (the chat core does).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from agentrl.serving.errors import APIError


@dataclass
class ToolCall:
    """One tool call of a reply: the chat core's unique ``call_<hex>`` id, the name, the JSON arguments."""

    id: str
    name: str
    arguments: str

    @property
    def input(self) -> Any:
        """The arguments parsed (the chat core only returns calls whose arguments are JSON)."""
        return json.loads(self.arguments)

    @property
    def hex(self) -> str:
        """The random part of the id, for dialects that spell ids with their own prefix."""
        return self.id.partition("_")[2] or self.id


@dataclass
class Reply:
    """What the chat core answered for one request (one choice: dialects ask for one)."""

    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    finish: str | None = None  # the chat finish_reason: "stop", "length" or "tool_calls"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    extra: dict = field(default_factory=dict)  # the choice's ``agentrl`` field (token ids, logprobs, ...)

    @property
    def stop_string(self) -> str | None:
        """The stop string the text was cut at, if any."""
        return self.extra.get("stop_string")

    @classmethod
    def of_response(cls, response: dict) -> Reply:
        """A whole ``chat.completion`` response -> its first (only) choice as a Reply."""
        choice = response["choices"][0]
        message = choice["message"]
        reply = cls(
            text=message.get("content") or "",
            finish=choice["finish_reason"],
            extra=choice.get("agentrl") or {},
        )
        reply.calls = [_call(c) for c in message.get("tool_calls") or []]
        reply.set_usage(response.get("usage") or {})
        return reply

    def set_usage(self, usage: dict) -> None:
        self.prompt_tokens = usage.get("prompt_tokens", 0)
        self.completion_tokens = usage.get("completion_tokens", 0)

    def chat_message(self) -> dict:
        """The reply as an OpenAI assistant message (what a later turn's history holds)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or (None if self.calls else "")}
        if self.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.calls
            ]
        return message


def _call(tc: dict) -> ToolCall:
    fn = tc.get("function") or {}
    return ToolCall(tc["id"], fn["name"], fn["arguments"])


def _error(body: dict) -> APIError:
    e = body["error"]
    return APIError(e["message"], status=e.get("code") or 500, param=e.get("param"), kind=e.get("type") or "api_error")


async def reply_events(chunks: AsyncIterator[dict], reply: Reply) -> AsyncIterator[tuple[str, Any]]:
    """The chat core's stream (``stream_options.include_usage`` set) -> neutral events, in order:
    ``("text", delta)`` as text is sampled, ``("call", ToolCall)`` per tool call (whole), then
    ``("end", None)`` once ``reply`` is complete (finish reason, usage, ``agentrl`` record), or
    ``("error", APIError)`` when the engine failed mid-stream (nothing follows it)."""
    async for c in chunks:
        if "error" in c:
            yield "error", _error(c)
            return
        if not c.get("choices"):  # the usage chunk, last
            reply.set_usage(c.get("usage") or {})
            continue
        choice = c["choices"][0]
        delta = choice.get("delta") or {}
        if delta.get("content"):
            reply.text += delta["content"]
            yield "text", delta["content"]
        for tc in delta.get("tool_calls") or []:
            reply.calls.append(_call(tc))
            yield "call", reply.calls[-1]
        if choice.get("finish_reason") is not None:
            reply.finish, reply.extra = choice["finish_reason"], choice.get("agentrl") or {}
    yield "end", None
