"""Parse tool calls out of the text of one assistant turn.

Owns: the ``ToolCall`` / ``ParsedTurn`` records and the named parsers (``PARSERS``) that turn an
assistant turn's decoded text into calls plus per-call errors. Two formats:

* ``hermes`` — Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks;
* ``python_block`` — fenced ```` ```python ```` blocks, each one a call to the ``python`` tool.

Does not: execute anything, check that a tool exists or that its arguments fit its signature
(that is ``agentrl.tools.base``), or touch tokens. Parsers never raise on model output: a malformed
call becomes a ``ToolCallError(kind="malformed")`` in ``ParsedTurn.errors`` whose message is
written to be shown to the model, and the other calls of the same turn are still parsed.

Model output is data: every parser is linear in the text (each tag search moves forward, error
snippets are cut before they are copied) and reads at most ``MAX_ATTEMPTS`` call attempts per turn
(one more error answers for the rest, which stays content); JSON nested deeper than ``MAX_DEPTH``
is rejected by a linear scan before ``json`` would recurse on it, and an integer past Python's
digit limit is a malformed call like any other. Call names have lone surrogates (``"\\ud83d"`` escapes) replaced,
since they reach tool messages and logs; arguments are kept as decoded (a tool may need them raw).

Ids are ``call_<n>`` where ``n`` is the position of the attempt among all call attempts of the
turn (valid or not), so they are deterministic and stable when an earlier attempt is malformed.
Each error carries the id of its attempt as ``error.call_id``, so a caller that wants to answer
in text order can sort calls and errors together by id.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from agentrl.errors import ConfigError, ToolCallError
from agentrl.trajectory import valid_text

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_SNIPPET = 80
#: deepest JSON nesting a call may have; deeper is malformed (real arguments nest a few levels)
MAX_DEPTH = 64
#: call attempts read per turn; past it one error answers for the rest (each attempt gets a tool
#: message, so 1,500 tags in a 16k-character turn would make a 200k-character observation)
MAX_ATTEMPTS = 64
# A JSON string (closed or running to the end) or one bracket: scanning these tokens finds the
# nesting depth json would see, in one pass, without counting brackets inside strings.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


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


def _too_many(call_id: str) -> ToolCallError:
    return _error(
        f"More than {MAX_ATTEMPTS} tool call attempts in one turn: the rest of the turn was not read. "
        f"Make fewer calls per turn.",
        call_id,
    )


def _head(text: str, start: int, end: int) -> str:
    """``text[start:end]`` cut to what a snippet can show, so an error costs O(1), not O(end - start)."""
    return text[start : min(end, start + 4 * _SNIPPET)]


def json_depth_over(src: str, limit: int = MAX_DEPTH) -> bool:
    """True if the JSON in ``src`` nests deeper than ``limit`` (linear; strings are skipped)."""
    if src.count("[") + src.count("{") <= limit:
        return False  # the common case: too few brackets to nest that deep at all
    depth = 0
    for m in _JSON_TOKEN.finditer(src):
        tok = m.group()
        if tok in ("[", "{"):
            depth += 1
            if depth > limit:
                return True
        elif tok in ("]", "}"):
            depth -= 1
    return False


def _decode(src: str, invalid: str, call_id: str) -> tuple[object, int] | ToolCallError:
    """``json`` raw_decode of ``src``, bounded in depth and digits; else an error for the model
    that reads ``<invalid> (<why>): <snippet>``."""

    def bad(why: str) -> ToolCallError:
        return _error(f"{invalid} ({why}): {_snippet(src)}. {_FORMAT_HINT}", call_id)

    if json_depth_over(src):
        return bad(f"nested more than {MAX_DEPTH} levels deep")
    try:
        return json.JSONDecoder().raw_decode(src)
    except json.JSONDecodeError as e:
        return bad(f"{e.msg} at char {e.pos}")
    except ValueError:  # the one other ValueError json raises: int() past the digit limit
        return bad(f"an integer of more than {sys.get_int_max_str_digits() or 4300} digits")
    except RecursionError:  # not reachable past json_depth_over; kept so the parser never raises
        return bad("nested too deep")


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
    decoded = _decode(src, "Invalid JSON in <tool_call>", call_id)
    if isinstance(decoded, ToolCallError):
        return decoded
    obj, end = decoded
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
    name = valid_text(name.strip())
    if isinstance(args, str) and args.strip():
        src = args.strip()
        decoded = _decode(src, f'"arguments" of {name!r} is a string that is not valid JSON', call_id)
        if isinstance(decoded, ToolCallError):
            return decoded
        args, end = decoded
        if src[end:].strip():
            return _error(
                f'"arguments" of {name!r} is a string with extra text after its JSON: {_snippet(src[end:])}.', call_id
            )
    elif isinstance(args, str):
        args = {}
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return _error(
            f'"arguments" of {name!r} must be a JSON object, got {type(args).__name__}: {_snippet(json.dumps(args))}.',
            call_id,
        )
    return ToolCall(name=name, arguments=args, id=call_id)


def parse_hermes(text: str) -> ParsedTurn:
    """Parse Hermes/Qwen ``<tool_call>...</tool_call>`` blocks; the rest of the text is content."""
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    content: list[str] = []
    pos, n = 0, 0
    # The next OPEN / CLOSE at or after pos, searched again only once pos has passed them: every
    # search moves forward, so the whole parse is linear however many tags the text holds.
    nxt_open, nxt_close = text.find(OPEN), text.find(CLOSE)

    def after(tag: str, found: int, at: int) -> int:
        return found if found == -1 or found >= at else text.find(tag, at)

    while True:
        nxt_open, nxt_close = after(OPEN, nxt_open, pos), after(CLOSE, nxt_close, pos)
        start, stray = nxt_open, nxt_close
        if n >= MAX_ATTEMPTS and (start != -1 or stray != -1):
            errors.append(_too_many(f"call_{n}"))
            content.append(text[pos:])
            break
        if stray != -1 and (start == -1 or stray < start):
            # A closing tag with no opening one: almost always a call whose <tool_call> was forgotten.
            content.append(text[pos:stray])
            errors.append(
                _error(
                    f"Found </tool_call> without a matching <tool_call> after {_snippet(text[max(pos, stray - _SNIPPET) : stray])}. "  # noqa: E501
                    f"{_FORMAT_HINT}",
                    f"call_{n}",
                )
            )
            n += 1
            pos = stray + len(CLOSE)
            continue
        if start == -1:
            content.append(text[pos:])
            break
        content.append(text[pos:start])
        body_start = start + len(OPEN)
        end = nxt_close = after(CLOSE, nxt_close, body_start)
        nxt = nxt_open = after(OPEN, nxt_open, body_start)
        if end == -1 or (nxt != -1 and nxt < end):
            body_end = len(text) if nxt == -1 else nxt
            errors.append(
                _error(
                    f"Unclosed <tool_call> tag (missing </tool_call>): {_snippet(_head(text, body_start, body_end))}. "
                    f"{_FORMAT_HINT}",
                    f"call_{n}",
                )
            )
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
        if n >= MAX_ATTEMPTS:
            errors.append(_too_many(f"call_{n}"))
            content.append(text[pos:])
            return ParsedTurn(content="".join(content).strip(), calls=calls, errors=errors)
        content.append(text[pos : m.start()])
        calls.append(ToolCall(name="python", arguments={"code": m.group(1).strip("\n")}, id=f"call_{n}"))
        n += 1
        pos = m.end()
    rest = text[pos:]
    dangling = _OPEN_FENCE.search(rest)
    if dangling:
        # Usually the turn hit its token limit inside the block; running half a program helps nobody.
        content.append(rest[: dangling.start()])
        errors.append(
            _error(f"Unclosed ```python block (missing closing ```): {_snippet(rest[dangling.end() :])}.", f"call_{n}")
        )
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
