"""The OpenAI Responses dialect (``POST /v1/responses``) as an adapter over the chat core.

Owns: translating a Responses body to the chat core's form (``input`` as a string or items:
messages, ``function_call``, ``function_call_output``; ``instructions``; ``tools`` of type
function; ``tool_choice``; ``parallel_tool_calls``; ``max_output_tokens``; ``temperature``,
``top_p``; ``text.format``), ``previous_response_id`` (the stored conversation of an earlier
response continues; ``instructions`` are not carried over, as OpenAI's), and the answer back: a
``response`` whose ``output`` holds a ``message`` item (``output_text``) and a ``function_call``
item per tool call (``call_id`` is the chat core's unique ``call_<hex>`` id), ``status``
``completed`` or ``incomplete`` (``max_output_tokens``), or the event stream
(``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` / ``.done``,
``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``, then
``response.completed`` or ``response.incomplete``), with a ``sequence_number`` each.

Where responses are kept: :class:`ResponseStore` (the last :data:`KEPT` of an `agentrl serve`
process), or whatever mapping the server's gate hands out (the recording proxy: the episode's
own, so an id resolves only within its episode). ``store: false`` keeps nothing.

Not supported (HTTP 400 naming the field): hosted tools, input items other than messages and
function calls / outputs, non-text content, ``background``. Does not: render, sample or parse
tool calls (the chat core).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, MutableMapping
from typing import Any

from agentrl.serving.dialects.reply import Reply, ToolCall, reply_events
from agentrl.serving.dialects.request import chat_request, chat_tools
from agentrl.serving.errors import APIError
from agentrl.serving.fields import num

#: responses an `agentrl serve` process keeps for ``previous_response_id`` (the oldest go first)
KEPT = 4096
_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponseStore(MutableMapping):
    """A bounded mapping of response id -> its conversation (chat messages, the reply last)."""

    def __init__(self, limit: int = KEPT) -> None:
        self.limit, self._items = limit, OrderedDict()

    def __getitem__(self, key: str) -> list[dict]:
        return self._items[key]

    def __setitem__(self, key: str, value: list[dict]) -> None:
        self._items[key] = value
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def __delitem__(self, key: str) -> None:
        del self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{where} must be a string or a list of text parts, got {content!r:.200}", param="input")
    parts = []
    for k, p in enumerate(content):
        if not (isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)):
            raise APIError(f"{where}[{k}] must be an input_text / output_text part, got {p!r:.200}", param="input")
        parts.append(p["text"])
    return "".join(parts)


def _call(item: dict, where: str) -> dict:
    if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
        raise APIError(f"{where} must be a function_call with call_id, name and arguments strings", param="input")
    fn = {"name": item["name"], "arguments": item["arguments"]}
    return {"id": item["call_id"], "type": "function", "function": fn}


def input_messages(value: Any) -> list[dict]:
    """``input`` -> chat messages; a ``function_call`` joins the assistant message before it."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not all(isinstance(i, dict) for i in value):
        raise APIError(f"input must be a string or a list of items, got {value!r:.200}", param="input")
    out: list[dict] = []
    for i, item in enumerate(value):
        kind, where = item.get("type", "message"), f"input[{i}]"
        if kind == "message":
            role = {"developer": "system"}.get(item.get("role"), item.get("role"))
            if role not in ("user", "assistant", "system"):
                raise APIError(f"{where}.role must be user, assistant, system or developer", param="input")
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            if not (out and out[-1]["role"] == "assistant"):
                out.append({"role": "assistant", "content": None})
            out[-1].setdefault("tool_calls", []).append(_call(item, where))
        elif kind == "function_call_output":
            out.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(item.get("output"), where)}
            )
        else:
            raise APIError(
                f"{where}.type={kind!r} is not supported (message, function_call, function_call_output are)",
                param="input",
            )
    return out


def _tool(t: dict) -> dict | None:
    if t.get("type") == "function" and isinstance(t.get("name"), str):
        return {"name": t["name"], "description": t.get("description") or "", "parameters": t.get("parameters") or {}}
    return None


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(
        f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'name': ...}}, got {choice!r:.200}",
        param="tool_choice",
    )


def _format(text: Any) -> dict | None:
    fmt = (text or {}).get("format") if isinstance(text, dict) else None
    kind = (fmt or {}).get("type")
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")}}
    raise APIError(f"text.format must be of type text, json_object or json_schema, got {fmt!r:.200}", param="text")


class OpenAIResponses:
    """One ``/v1/responses`` request: its chat form, and the chat core's answer as a Response.

    ``store`` is where responses are kept for ``previous_response_id`` (see the module docstring)."""

    path = "/v1/responses"

    def __init__(self, body: dict, model: str, store: MutableMapping) -> None:
        self.body, self.model, self.store = body, body.get("model") or model, store
        self.id = _new_id("resp")
        self.created = int(time.time())
        self.history: list[dict] = []  # the conversation without instructions: what a later turn continues
        self.seq = 0

    def chat(self) -> dict:
        """The body in the chat core's terms (every field checked, a bad one named)."""
        b = self.body
        if b.get("background"):
            raise APIError("background responses are not supported by this server", param="background")
        prev = b.get("previous_response_id")
        if prev is not None:
            if prev not in self.store:
                raise APIError(
                    f"previous response {prev!r} was not found (or is no longer kept)", param="previous_response_id"
                )
            self.history = list(self.store[prev])
        self.history += input_messages(b.get("input"))
        system = b.get("instructions")
        if system is not None and not isinstance(system, str):
            raise APIError(f"instructions must be a string, got {system!r:.200}", param="instructions")
        chat = chat_request(b, ([{"role": "system", "content": system}] if system else []) + self.history)
        limit = num(b, "max_output_tokens", None, lo=1, integer=True)
        if limit is not None:
            chat["max_tokens"] = limit
        chat.update({k: b[k] for k in ("temperature", "top_p", "parallel_tool_calls") if b.get(k) is not None})
        shape = "{'type': 'function', 'name': ..., 'parameters': ...} (hosted tools are not served here)"
        if (tools := chat_tools(b.get("tools"), _tool, shape)) is not None:
            chat["tools"] = tools
        if b.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(b["tool_choice"])
        if (fmt := _format(b.get("text"))) is not None:
            chat["response_format"] = fmt
        return chat

    # ------------------------------------------------------------------ answers
    def response(self, output: list[dict], reply: Reply | None) -> dict:
        """The ``response`` object (``reply`` None: the one a stream starts with, in progress)."""
        b = self.body
        status = "in_progress" if reply is None else "incomplete" if reply.finish == "length" else "completed"
        reply = reply or Reply()
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.get("instructions"),
            "max_output_tokens": b.get("max_output_tokens"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls", True),
            "previous_response_id": b.get("previous_response_id"),
            "temperature": b.get("temperature"),
            "top_p": b.get("top_p"),
            "tool_choice": b.get("tool_choice", "auto"),
            "tools": b.get("tools") or [],
            "text": {"format": {"type": "text"}},
            "store": b.get("store", True),
            "usage": {
                "input_tokens": reply.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": reply.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
            "metadata": b.get("metadata") or {},
            "agentrl": reply.extra,
        }

    def _keep(self, reply: Reply) -> None:
        if self.body.get("store", True) is not False:
            self.store[self.id] = [*self.history, reply.chat_message()]

    def whole(self, reply: Reply) -> dict:
        self._keep(reply)
        items = ([_message_item(_new_id("msg"), reply.text, "completed")] if reply.text else []) + [
            _call_item(c, "completed") for c in reply.calls
        ]
        return self.response(items, reply)

    def _event(self, kind: str, **fields: Any) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    async def stream(self, chunks: AsyncIterator[dict]) -> AsyncGenerator[dict, None]:
        """The chat core's stream as Responses stream events (each event's name is its ``type``)."""
        reply, output = Reply(), []
        yield self._event("response.created", response=self.response([], None))
        yield self._event("response.in_progress", response=self.response([], None))
        text: dict | None = None  # the message item being streamed
        async for kind, value in reply_events(chunks, reply):
            if kind == "error":
                yield self._event("error", code=value.kind, message=str(value), param=value.param)
                return
            if text is not None and kind != "text":
                for e in self._close_text(text, len(output) - 1):
                    yield e
                text = None
            if kind == "text":
                if text is None:
                    text = _message_item(_new_id("msg"), "", "in_progress")
                    output.append(text)
                    for e in self._open_text(text, len(output) - 1):
                        yield e
                text["content"][0]["text"] += value
                at = {"item_id": text["id"], "output_index": len(output) - 1, "content_index": 0}
                yield self._event("response.output_text.delta", **at, delta=value, logprobs=[])
            elif kind == "call":
                output.append(_call_item(value, "completed"))
                for e in self._call_events(output[-1], len(output) - 1):
                    yield e
        self._keep(reply)
        final = self.response(output, reply)
        yield self._event(f"response.{final['status']}", response=final)

    def _open_text(self, item: dict, index: int) -> list[dict]:
        added = {**item, "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self._event("response.output_item.added", output_index=index, item=added),
            self._event(
                "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part
            ),
        ]

    def _close_text(self, item: dict, index: int) -> list[dict]:
        item["status"] = "completed"
        part, at = item["content"][0], {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self._event("response.output_text.done", **at, text=part["text"], logprobs=[]),
            self._event("response.content_part.done", **at, part=part),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _call_events(self, item: dict, index: int) -> list[dict]:
        at = {"item_id": item["id"], "output_index": index}
        return [
            self._event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            ),
            self._event("response.function_call_arguments.delta", **at, delta=item["arguments"]),
            self._event("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"]),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    @staticmethod
    def error_body(e: APIError) -> dict:
        return e.body()


def _message_item(item_id: str, text: str, status: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [part]}


def _call_item(call: ToolCall, status: str) -> dict:
    return {
        "id": f"fc_{call.hex}",
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }
