"""Supervised sequences from chat data: ``SFTExample`` and the chat JSONL loader.

Owns: ``SFTExample`` (token ids + 0/1 loss mask), ``chat_example`` (one conversation rendered with
the model's chat template, token-exact like an episode: mask 1 on every assistant turn's content
and its end-of-turn token, 0 on everything else) and ``load_chat_jsonl`` (rows
``{"messages": [...], "tools": [...]}``, OpenAI-style ``tool_calls`` accepted; a bad row raises
``DatasetError`` naming the file and the 1-based row).

Does not: make demonstrations or train (``agentrl.warmstart.sft``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.episodes.chat import ChatRenderer
from agentrl.errors import DatasetError, TemplateError


@dataclass
class SFTExample:
    """One supervised sequence: ``token_ids`` and a 0/1 ``loss_mask`` of the same length."""

    token_ids: list[int]
    loss_mask: list[int]
    source: str = ""  # "demo:<task id>" or "<file>:<row>"

    @property
    def num_target(self) -> int:
        return sum(self.loss_mask)


_ROLES = ("system", "user", "assistant", "tool")


def _check_row(row: Any, where: str) -> tuple[list[dict], list[dict] | None]:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object with 'messages', got {type(row).__name__}")
    unknown = sorted(set(row) - {"messages", "tools"})
    if unknown:
        raise DatasetError(f"{where}: unknown key(s) {unknown}; a row holds 'messages' and optionally 'tools'")
    messages, tools = row.get("messages"), row.get("tools")
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: 'messages' must be a non-empty list of messages")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise DatasetError(f"{where}: 'tools' must be a list of JSON tool schemas")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise DatasetError(f"{where}: message {k} must be an object with 'role' in {list(_ROLES)}, got {m!r:.80}")
        content, calls = m.get("content"), m.get("tool_calls")
        if calls is not None and (m["role"] != "assistant" or not isinstance(calls, list)):
            raise DatasetError(f"{where}: message {k}: 'tool_calls' must be a list, on an assistant message")
        if not isinstance(content, str) and not (content is None and calls):
            raise DatasetError(f"{where}: message {k} ({m['role']}): 'content' must be a string")
        m = dict(m)
        if calls:
            m["tool_calls"] = [_normalize_call(c, f"{where}: message {k}") for c in calls]
        out.append(m)
    if not any(m["role"] == "assistant" for m in out):
        raise DatasetError(f"{where}: no assistant message, so nothing to train on")
    last = max(i for i, m in enumerate(out) if m["role"] == "assistant")
    return out[: last + 1], tools


def _normalize_call(call: Any, where: str) -> dict:
    """OpenAI-style calls carry ``arguments`` as a JSON string; templates expect an object."""
    fn = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise DatasetError(f"{where}: a tool call needs a 'name' (or function.name), got {call!r:.80}")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: tool call {fn['name']!r} has arguments that are not JSON: {e}") from None
    return {"type": "function", "function": {"name": fn["name"], "arguments": args}}


def chat_example(tokenizer, messages: list[dict], tools: list[dict] | None = None, source: str = "") -> SFTExample:
    """Token ids and mask of one conversation, built like an episode: the prompt and every
    non-assistant stretch come from ``ChatRenderer`` (mask 0), each assistant turn is its rendered
    content plus the end-of-turn id (mask 1). The result decodes to the template's rendering of
    the whole conversation (without the glue after the last turn); TemplateError otherwise."""
    r = ChatRenderer(tokenizer, tools=tools)
    if r.end_of_turn_id is None:
        raise TemplateError(r._turn_error or "the chat template has no end-of-turn token")
    eot = tokenizer.convert_ids_to_tokens(r.end_of_turn_id)
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = r.prompt_ids(messages[:first])
    mask = [0] * len(ids)
    i = first
    while i < len(messages):
        before = r.render(messages[:i], add_generation_prompt=True)
        after = r.render(messages[: i + 1])
        if not after.startswith(before) or not after[len(before) :].endswith(eot + r.glue):
            raise TemplateError(
                f"{source}: assistant message {i} does not render as generation prompt + "
                f"content + {eot!r} ({after[len(before) :][-60:]!r})"
            )
        body = r.encode(after[len(before) : len(after) - len(eot + r.glue)]) + [r.end_of_turn_id]
        ids += body
        mask += [1] * len(body)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j < len(messages):
            obs = r.observation_ids(messages[i + 1 : j])
            ids += obs
            mask += [0] * len(obs)
        i = j
    full = r.render(messages)
    if tokenizer.decode(ids, skip_special_tokens=False) + r.glue != full:
        raise TemplateError(
            f"{source}: the conversation's ids do not decode to its rendering; the chat "
            "template lacks the prefix property (run `agentrl check-template`)"
        )
    return SFTExample(ids, mask, source)


def load_chat_jsonl(path: str | Path, tokenizer) -> list[SFTExample]:
    """``SFTExample``s from a JSONL file of ``{"messages": [...], "tools": [...]}`` rows (blank lines
    skipped). Any bad row raises ``DatasetError`` naming the file and the 1-based row."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"{p}: no such file")
    out = []
    with open(p, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{p}: row {n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: not valid JSON: {e}") from None
            messages, tools = _check_row(row, where)
            try:
                out.append(chat_example(tokenizer, messages, tools, where))
            except TemplateError as e:
                msg = str(e)
                raise DatasetError(msg if msg.startswith(where) else f"{where}: {msg}") from e
    if not out:
        raise DatasetError(f"{p}: no rows")
    return out
