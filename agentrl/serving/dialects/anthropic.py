"""The Anthropic Messages dialect (``POST /v1/messages``) as an adapter over the chat core.

Owns: translating a Messages body to the chat core's form (``system``; ``messages`` whose content
is text or ``text`` / ``tool_use`` / ``tool_result`` blocks; ``tools`` with ``input_schema``;
``tool_choice`` auto / any / tool / none; ``max_tokens``, ``stop_sequences``, ``temperature``,
``top_p``, ``top_k``), and the answer back: a ``message`` with ``text`` and ``tool_use`` blocks
(ids ``toolu_<hex>``, unique like the chat core's call ids) and ``stop_reason`` ``end_turn`` /
``max_tokens`` / ``stop_sequence`` / ``tool_use``, or the event stream (``message_start``,
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``) /
``content_block_stop``, ``message_delta`` with the stop reason and usage, ``message_stop``), and
errors as ``{"type": "error", "error": {"type": ..., "message": ...}}``.

Every message gets an ``agentrl`` field (the chat core's: exact sampled ids, logprobs, versions).
Not supported (HTTP 400 naming the field): image and document blocks, extended ``thinking``, a
final assistant message (prefill). Does not: render, sample or parse tool calls (the chat core).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from agentrl.serving.dialects.reply import Reply, ToolCall, reply_events
from agentrl.serving.dialects.request import chat_request, chat_tools
from agentrl.serving.errors import APIError
from agentrl.serving.fields import num

_STOP = {"tool_calls": "tool_use", "length": "max_tokens"}
_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
_ERRORS.update({413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error"})


def _text_of(blocks: Any, where: str) -> str:
    """A string, or a list of ``text`` blocks joined."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise APIError(f"{where} must be a string or a list of content blocks, got {blocks!r:.200}", param=where)
    parts = []
    for k, b in enumerate(blocks):
        if not (isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)):
            raise APIError(f"{where}[{k}] must be a text block, got {b!r:.200}", param=where)
        parts.append(b["text"])
    return "".join(parts)


def _blocks(content: Any, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise APIError(f"{where} must be a string or a list of content blocks, got {content!r:.200}", param=where)
    return content


def _user(blocks: list[dict], where: str) -> list[dict]:
    """A user turn -> a tool message per ``tool_result`` block, then the text (chat order)."""
    tools, texts = [], []
    for k, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "tool_result":
            out = _text_of(b.get("content", ""), f"{where}[{k}].content")
            if b.get("is_error"):
                out = f"Error: {out}"
            tools.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": out})
        elif kind == "text":
            texts.append(_text_of([b], where))
        else:
            raise APIError(
                f"{where}[{k}]: {kind!r} blocks are not supported here (text and tool_result are)", param=where
            )
    return tools + ([{"role": "user", "content": "".join(texts)}] if texts else [])


def _assistant(blocks: list[dict], where: str) -> dict:
    texts, calls = [], []
    for k, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "text":
            texts.append(_text_of([b], where))
        elif kind == "tool_use":
            if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                raise APIError(f"{where}[{k}] must be a tool_use block with a name and an input object", param=where)
            args = json.dumps(b.get("input", {}))
            calls.append({"id": b.get("id"), "type": "function", "function": {"name": b["name"], "arguments": args}})
        else:
            raise APIError(f"{where}[{k}]: {kind!r} blocks are not supported here (text and tool_use are)", param=where)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    return {**message, "tool_calls": calls} if calls else message


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(f"messages must be a non-empty list, got {msgs!r:.200}", param="messages")
    out = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "system")})
    for i, m in enumerate(msgs):
        where = f"messages[{i}].content"
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            out.extend(_user(_blocks(m.get("content"), where), where))
        elif role == "assistant":
            out.append(_assistant(_blocks(m.get("content"), where), where))
        else:
            raise APIError(f"messages[{i}].role must be 'user' or 'assistant', got {role!r}", param="messages")
    if msgs[-1].get("role") == "assistant":
        raise APIError("messages: a final assistant message (prefill) is not supported", param="messages")
    return out


def _tool(t: dict) -> dict | None:
    if isinstance(t.get("name"), str) and isinstance(t.get("input_schema"), dict):
        return {"name": t["name"], "description": t.get("description", ""), "parameters": t["input_schema"]}
    return None


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if kind in ("auto", "any", "none"):
        return {"any": "required"}.get(kind, kind)
    raise APIError(
        f"tool_choice must be {{'type': 'auto' | 'any' | 'none'}} or {{'type': 'tool', 'name': ...}}, "
        f"got {choice!r:.200}",
        param="tool_choice",
    )


def _stops(body: dict) -> list[str] | None:
    stops = body.get("stop_sequences")
    if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)):
        raise APIError(
            f"stop_sequences must be a list of non-empty strings, got {stops!r:.200}", param="stop_sequences"
        )
    return stops or None


class AnthropicMessages:
    """One ``/v1/messages`` request: its chat form, and the chat core's answer as a Messages answer."""

    path = "/v1/messages"

    def __init__(self, body: dict, model: str, store: Any = None) -> None:
        self.body, self.model = body, body.get("model") or model
        self.id = f"msg_{uuid.uuid4().hex[:24]}"

    def chat(self) -> dict:
        """The body in the chat core's terms (every field checked, a bad one named)."""
        b = self.body
        if b.get("max_tokens") is None:
            raise APIError("max_tokens is required", param="max_tokens")
        if (b.get("thinking") or {}).get("type") not in (None, "disabled"):
            raise APIError("thinking (extended thinking) is not supported by this server", param="thinking")
        num(b, "temperature", None, lo=0, hi=1)
        chat = chat_request(b, _messages(b))
        chat["max_tokens"] = num(b, "max_tokens", None, lo=1, integer=True)
        chat.update({k: b[k] for k in ("temperature", "top_p", "top_k") if b.get(k) is not None})
        if (tools := chat_tools(b.get("tools"), _tool, "{'name': ..., 'input_schema': {...}}")) is not None:
            chat["tools"] = tools
        choice = b.get("tool_choice")
        if choice is not None:
            chat["tool_choice"] = _tool_choice(choice)
            if choice.get("disable_parallel_tool_use"):
                chat["parallel_tool_calls"] = False
        if stops := _stops(b):
            chat["stop"] = stops
        return chat

    # ------------------------------------------------------------------ answers
    def message(self, reply: Reply | None = None) -> dict:
        """The whole ``message`` of ``reply`` (None: the empty one a stream starts with)."""
        done = reply is not None
        reply = reply or Reply()
        content: list[dict] = [{"type": "text", "text": reply.text}] if reply.text else []
        content += [_tool_use(c) for c in reply.calls]
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": _stop_reason(reply) if done else None,
            "stop_sequence": reply.stop_string if done else None,
            "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens},
            **({"agentrl": reply.extra} if done else {}),
        }

    def whole(self, reply: Reply) -> dict:
        return self.message(reply)

    async def stream(self, chunks: AsyncIterator[dict]) -> AsyncGenerator[dict, None]:
        """The chat core's stream as Messages stream events (each event's name is its ``type``)."""
        reply = Reply()
        yield {"type": "message_start", "message": self.message()}
        index, text_open = 0, False

        def start(block: dict) -> dict:
            return {"type": "content_block_start", "index": index, "content_block": block}

        def delta(d: dict) -> dict:
            return {"type": "content_block_delta", "index": index, "delta": d}

        async for kind, value in reply_events(chunks, reply):
            if kind == "error":
                yield self.error_body(value)
                return
            if text_open and kind != "text":  # a text block ends where a tool call or the reply does
                yield {"type": "content_block_stop", "index": index}
                index, text_open = index + 1, False
            if kind == "text":
                if not text_open:
                    yield start({"type": "text", "text": ""})
                    text_open = True
                yield delta({"type": "text_delta", "text": value})
            elif kind == "call":
                yield start({**_tool_use(value), "input": {}})
                yield delta({"type": "input_json_delta", "partial_json": value.arguments})
                yield {"type": "content_block_stop", "index": index}
                index += 1
        yield {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": reply.stop_string},
            "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens},
            "agentrl": reply.extra,
        }
        yield {"type": "message_stop"}

    @staticmethod
    def error_body(e: APIError) -> dict:
        kind = _ERRORS.get(e.status, "api_error" if e.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": str(e)}}


def _tool_use(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": f"toolu_{call.hex}", "name": call.name, "input": call.input}


def _stop_reason(reply: Reply) -> str:
    if reply.finish == "stop" and reply.stop_string:
        return "stop_sequence"
    return _STOP.get(reply.finish or "stop", "end_turn")
