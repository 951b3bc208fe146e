"""Parse tool calls out of the text of one assistant turn.

Owns: the ``ToolCall`` / ``ParsedTurn`` records and the named parsers (``PARSERS``) that turn an
assistant turn's decoded text into calls plus per-call errors. Two formats:

* ``hermes`` — Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks;
* ``python_block`` — fenced ```` ```python ```` blocks, each one a call to the ``python`` tool.

Does not: execute anything, check that a tool exists or that its arguments fit its signature
(that is ``agentrl.tooling``), or touch tokens. Parsers never raise on model output: a malformed
call becomes a ``ToolCallError(kind="malformed")`` in ``ParsedTurn.errors`` whose message is
written to be shown to the model, and the other calls of the same turn are still parsed.

Ids are ``call_<n>`` where ``n`` is the position of the attempt among all call attempts of the
turn (valid or not), so they are deterministic and stable when an earlier attempt is malformed.
Each error carries the id of its attempt as ``error.call_id``, so a caller that wants to answer
in text order can sort calls and errors together by id.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from agentrl.errors import ConfigError, ToolCallError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_SNIPPET = 80


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = ""


@dataclass
class ParsedTurn:
    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)

    @property
    def n_attempts(self) -> int:
        """Calls plus malformed calls: how many tool answers the turn asks for."""
        return len(self.calls) + len(self.errors)


def _snippet(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= _SNIPPET else text[:_SNIPPET] + "...")


def _error(message: str, call_id: str) -> ToolCallError:
    err = ToolCallError(message, kind="malformed")
    err.call_id = call_id  # type: ignore[attr-defined]  # lets callers order answers by attempt
    return err


_FORMAT_HINT = 'Use <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>.'


def _hermes_body(body: str, call_id: str) -> ToolCall | ToolCallError:
    """One ``<tool_call>`` body -> a call, or an error message for the model."""
    src = body.strip()
    if not src:
        return _error(f"Empty <tool_call> block. {_FORMAT_HINT}", call_id)
    try:
        obj, end = json.JSONDecoder().raw_decode(src)
    except json.JSONDecodeError as e:
        return _error(f"Invalid JSON in <tool_call> ({e.msg} at char {e.pos}): {_snippet(src)}. {_FORMAT_HINT}", call_id)
    if src[end:].strip():
        # Two objects in one tag, or trailing text: tell the model rather than guess.
        return _error(
            f"Extra text after the JSON object in <tool_call>: {_snippet(src[end:])}. Put one call per tag.", call_id
        )
    if not isinstance(obj, dict):
        return _error(f"<tool_call> must hold a JSON object, got {type(obj).__name__}: {_snippet(src)}.", call_id)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return _error(f'<tool_call> is missing a "name" string: {_snippet(src)}. {_FORMAT_HINT}', call_id)
    # "parameters" is what Llama-style models write; accepting it costs nothing and is unambiguous.
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return _error(
                f'"arguments" of {name!r} is a string that is not valid JSON ({e.msg}): {_snippet(args)}.', call_id
            )
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return _error(
            f'"arguments" of {name!r} must be a JSON object, got {type(args).__name__}: {_snippet(json.dumps(args))}.',
            call_id,
        )
    return ToolCall(name=name.strip(), arguments=args, id=call_id)


def parse_hermes(text: str) -> ParsedTurn:
    """Parse Hermes/Qwen ``<tool_call>...</tool_call>`` blocks; the rest of the text is content."""
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    content: list[str] = []
    pos, n = 0, 0
    while True:
        start = text.find(OPEN, pos)
        stray = text.find(CLOSE, pos)
        if stray != -1 and (start == -1 or stray < start):
            # A closing tag with no opening one: almost always a call whose <tool_call> was forgotten.
            content.append(text[pos:stray])
            errors.append(_error(
                f"Found </tool_call> without a matching <tool_call> after {_snippet(text[pos:stray][-_SNIPPET:])}. "
                f"{_FORMAT_HINT}",
                f"call_{n}",
            ))
            n += 1
            pos = stray + len(CLOSE)
            continue
        if start == -1:
            content.append(text[pos:])
            break
        content.append(text[pos:start])
        body_start = start + len(OPEN)
        end = text.find(CLOSE, body_start)
        nxt = text.find(OPEN, body_start)
        if end == -1 or (nxt != -1 and nxt < end):
            body_end = len(text) if nxt == -1 else nxt
            errors.append(_error(
                f"Unclosed <tool_call> tag (missing </tool_call>): {_snippet(text[body_start:body_end])}. "
                f"{_FORMAT_HINT}",
                f"call_{n}",
            ))
            n += 1
            pos = body_end
            continue
        result = _hermes_body(text[body_start:end], f"call_{n}")
        (errors if isinstance(result, ToolCallError) else calls).append(result)
        n += 1
        pos = end + len(CLOSE)
    return ParsedTurn(content="".join(content).strip(), calls=calls, errors=errors)


_FENCE = re.compile(r"```(?:python|py)[ \t]*\r?\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```(?:python|py)[ \t]*(?:\r?\n|$)")


def parse_python_block(text: str) -> ParsedTurn:
    """Each fenced ```` ```python ```` (or ```` ```py ````) block is a call to the ``python`` tool."""
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    content: list[str] = []
    pos, n = 0, 0
    for m in _FENCE.finditer(text):
        content.append(text[pos:m.start()])
        calls.append(ToolCall(name="python", arguments={"code": m.group(1).strip("\n")}, id=f"call_{n}"))
        n += 1
        pos = m.end()
    rest = text[pos:]
    dangling = _OPEN_FENCE.search(rest)
    if dangling:
        # Usually the turn hit its token limit inside the block; running half a program helps nobody.
        content.append(rest[:dangling.start()])
        errors.append(_error(
            f"Unclosed ```python block (missing closing ```): {_snippet(rest[dangling.end():])}.", f"call_{n}"
        ))
    else:
        content.append(rest)
    return ParsedTurn(content="".join(content).strip(), calls=calls, errors=errors)


PARSERS: dict[str, Callable[[str], ParsedTurn]] = {"hermes": parse_hermes, "python_block": parse_python_block}


def get_parser(name: str) -> Callable[[str], ParsedTurn]:
    """The parser registered as ``name``; ConfigError naming the bad value and the choices."""
    try:
        return PARSERS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown tool-call parser {name!r}; choices: {', '.join(sorted(PARSERS))}") from None
