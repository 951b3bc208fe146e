"""The parts of a chat-core request every dialect builds the same way.

Owns: :func:`chat_request` (the chat body's start: messages, the model when named, streaming with
the usage chunk the dialects' final events need) and :func:`chat_tools` (a dialect's ``tools`` list
as chat tools, a bad entry named). Does not: read any dialect's own fields
(:mod:`agentrl.serving.dialects.anthropic`, :mod:`agentrl.serving.dialects.responses`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.serving.errors import APIError


def chat_request(body: dict, messages: list[dict]) -> dict:
    """The chat body for ``messages``: ``model`` when ``body`` names one, ``stream`` with usage."""
    chat: dict[str, Any] = {"messages": messages, "stream": bool(body.get("stream"))}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True}
    return chat


def chat_tools(tools: Any, read: Callable[[dict], dict | None], shape: str) -> list[dict] | None:
    """A dialect's ``tools`` -> chat tools. ``read(tool)`` is the tool's function (name, description,
    parameters), or None when the entry is not a tool of the dialect's ``shape`` (HTTP 400 naming it)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise APIError(f"tools must be a list, got {tools!r:.200}", param="tools")
    out = []
    for i, t in enumerate(tools):
        fn = read(t) if isinstance(t, dict) else None
        if fn is None:
            raise APIError(f"tools[{i}] must be {shape}, got {t!r:.200}", param="tools")
        out.append({"type": "function", "function": fn})
    return out
