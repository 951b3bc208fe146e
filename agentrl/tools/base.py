"""Typed async tools: a JSON schema derived from a function's signature and docstring.

Owns: ``Tool`` (schema + argument validation/coercion + async call), the ``@tool`` decorator and
``ToolSet`` (dispatch of a parsed ``ToolCall`` by name). Supported annotations: ``str``, ``int``,
``float``, ``bool``, ``list[T]``, ``dict`` / ``dict[str, T]``, ``Optional[T]`` / ``T | None``,
``Literal[...]`` and no annotation (anything). Parameters with defaults are not required.

Does not: parse tool calls out of text (``agentrl.tools.calls``), sandbox anything, or enforce
deadlines (the episode manager wraps calls in its own timeout). Mistakes of the *model* (unknown
tool, bad arguments) raise ``ToolCallError``, whose message is meant to be shown to the model;
any other exception raised by the tool function propagates unchanged — the env decides whether
it is the model's fault or an infrastructure failure. Validation never raises anything else on a
model's values: an integer string past ``MAX_INT_DIGITS`` is a bad argument, and a value too deep
to render shows as its type in the message.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, Union

from agentrl.errors import ConfigError, ToolCallError
from agentrl.tools.calls import ToolCall
from agentrl.trajectory import json_text, valid_text

_NONE = type(None)
#: longest integer string a tool argument may be (Python's default int/str conversion limit)
MAX_INT_DIGITS = 4300
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    for py, js in ((str, "string"), (int, "integer"), (float, "number"), (list, "array"), (dict, "object")):
        if isinstance(value, py):
            return js
    return type(value).__name__


def _show(value: Any) -> str:
    """A short JSON rendering of a model's value for an error message; never raises (a value too
    deep or too big to render shows as its type)."""
    try:
        text = json.dumps(value, default=str)
    except (ValueError, RecursionError):
        return f"<{_json_type(value)}>"
    return text if len(text) <= 60 else text[:60] + "..."


# ---------------------------------------------------------------- annotations -> JSON schema
def _schema(tp: Any, where: str) -> dict:
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is list or origin is list:
        return {"type": "array", "items": _schema(args[0], where)} if args else {"type": "array"}
    if tp is dict or origin is dict:
        if len(args) == 2 and args[1] is not Any:
            return {"type": "object", "additionalProperties": _schema(args[1], where)}
        return {"type": "object"}
    if origin is Literal:
        kinds = {_json_type(a) for a in args}
        out: dict = {"enum": list(args)}
        if len(kinds) == 1:
            out["type"] = kinds.pop()
        return out
    if origin is Union or origin is types.UnionType:
        inner = [a for a in args if a is not _NONE]
        subs = [_schema(a, where) for a in inner]
        if _NONE in args:
            subs.append({"type": "null"})
        if all(set(s) == {"type"} and isinstance(s["type"], str) for s in subs):
            return {"type": [s["type"] for s in subs]}
        return {"anyOf": subs}
    raise TypeError(
        f"{where}: unsupported annotation {tp!r} (use str, int, float, bool, list, dict, Optional, Literal)"
    )


# ---------------------------------------------------------------- validation / coercion
class _Bad(Exception):
    """Internal: a value does not fit; message says what was expected."""


def _coerce(value: Any, tp: Any) -> Any:
    if tp is inspect.Parameter.empty or tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union or origin is types.UnionType:
        if value is None and _NONE in args:
            return None
        errors = []
        for a in (a for a in args if a is not _NONE):
            try:
                return _coerce(value, a)
            except _Bad as e:
                errors.append(str(e))
        raise _Bad(" or ".join(errors))
    if origin is Literal:
        # Compare types too: JSON true must not match Literal[1] just because True == 1.
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise _Bad(f"one of {', '.join(json.dumps(a) for a in args)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise _Bad("a boolean")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
            # int() refuses (ValueError) past this many digits, and is quadratic below it when unset
            if len(value.strip().lstrip("+-")) > MAX_INT_DIGITS:
                raise _Bad(f"an integer of at most {MAX_INT_DIGITS} digits")
            return int(value)
        raise _Bad("an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise _Bad("a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Bad("a string")
    if tp is list or origin is list:
        if not isinstance(value, list):
            raise _Bad("a list")
        if not args:
            return value
        out = []
        for i, item in enumerate(value):
            try:
                out.append(_coerce(item, args[0]))
            except _Bad as e:
                raise _Bad(f"a list whose items are {e} (item {i} is {_json_type(item)} {_show(item)})") from None
        return out
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise _Bad("an object")
        if len(args) == 2 and args[1] is not Any:
            return {k: _coerce(v, args[1]) for k, v in value.items()}
        return value
    return value


# ---------------------------------------------------------------- docstrings
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns?|Yields?|Raises|Examples?|Notes?|Attributes)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*\**(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """First paragraph -> description; Google-style ``Args:`` entries -> parameter descriptions."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    para: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line):
            break
        para.append(line.strip())
    params: dict[str, str] = {}
    in_args, current, indent = False, None, None
    for line in lines:
        m = _SECTION.match(line)
        if m:
            in_args, current = m.group(1) in ("Args", "Arguments", "Parameters"), None
            continue
        if not in_args or not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        am = _ARG_LINE.match(line)
        if am and (indent is None or depth <= indent):
            indent, current = depth, am.group(1)
            params[current] = am.group(2).strip()
        elif current and indent is not None and depth > indent:
            params[current] = (params[current] + " " + line.strip()).strip()
        else:
            in_args = False  # dedented text ends the section
    return " ".join(para), params


# ---------------------------------------------------------------- Tool / @tool / ToolSet
class Tool:
    """An async-callable tool with a JSON schema; build it with ``@tool``."""

    def __init__(self, fn: Callable, *, name: str | None = None, description: str | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        doc_desc, arg_docs = _parse_docstring(inspect.getdoc(fn))
        self.description = description if description is not None else doc_desc
        try:
            hints = typing.get_type_hints(fn)
        except Exception as e:  # a forward reference we cannot resolve is a bug in the tool's module
            raise TypeError(f"tool {self.name!r}: cannot resolve annotations: {e}") from e
        self._types: dict[str, Any] = {}
        props: dict[str, dict] = {}
        required: list[str] = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"tool {self.name!r}: *args/**kwargs cannot be described by a JSON schema")
            if p.kind is p.POSITIONAL_ONLY:
                raise TypeError(f"tool {self.name!r}: positional-only parameter {p.name!r} cannot take a keyword")
            tp = hints.get(p.name, inspect.Parameter.empty)
            self._types[p.name] = tp
            prop = _schema(tp, f"tool {self.name!r} parameter {p.name!r}")
            if p.name in arg_docs and arg_docs[p.name]:
                prop["description"] = arg_docs[p.name]
            if p.default is p.empty:
                required.append(p.name)
            elif p.default is None or isinstance(p.default, (str, int, float, bool, list, dict)):
                prop["default"] = p.default
            props[p.name] = prop
        self.parameters: dict = {"type": "object", "properties": props, "required": required}
        self._required = required
        # `x: dict = None` is a common idiom: an explicit null means "use the default".
        self._none_ok = {p.name for p in inspect.signature(fn).parameters.values() if p.default is None}

    def schema(self) -> dict:
        """OpenAI/HF ``{"type": "function", "function": {...}}`` entry for ``apply_chat_template(tools=...)``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, arguments: dict) -> dict:
        """Coerce ``arguments`` to the annotated types; ToolCallError(kind="bad_arguments") on a mismatch."""
        if not isinstance(arguments, dict):
            raise ToolCallError(
                f"tool {self.name!r} takes a JSON object of arguments, got {_json_type(arguments)}",
                kind="bad_arguments",
            )
        takes = ", ".join(self._types) or "no arguments"
        unexpected = [k for k in arguments if k not in self._types]
        if unexpected:
            raise ToolCallError(
                f"tool {self.name!r} got unexpected argument {unexpected[0]!r}; it takes: {takes}", kind="bad_arguments"
            )
        missing = [k for k in self._required if k not in arguments]
        if missing:
            raise ToolCallError(
                f"tool {self.name!r} is missing required argument {missing[0]!r}; it takes: {takes}",
                kind="bad_arguments",
            )
        out = {}
        for key, value in arguments.items():
            if value is None and key in self._none_ok:
                out[key] = None
                continue
            try:
                out[key] = _coerce(value, self._types[key])
            except _Bad as e:
                raise ToolCallError(
                    f"argument {key!r} of tool {self.name!r} must be {e}, got {_json_type(value)} {_show(value)}",
                    kind="bad_arguments",
                ) from None
        return out

    async def __call__(self, **kwargs: Any) -> str:
        """Run the function (sync ones in a worker thread, so the event loop keeps going) -> text."""
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(**kwargs)
        else:
            result = await asyncio.to_thread(self.fn, **kwargs)
            if inspect.isawaitable(result):  # e.g. a sync wrapper around a coroutine function
                result = await result
        return _to_text(result)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


def _to_text(result: Any) -> str:
    """A tool's result as valid text: it becomes a tool message, is tokenized and logged, and a
    lone surrogate (a tool echoing a model's ``"\\ud83d"`` argument) would fail all three."""
    if result is None:
        return ""
    if isinstance(result, str):
        return valid_text(result)
    if isinstance(result, bytes):
        return result.decode("utf-8", errors="replace")
    if isinstance(result, (dict, list, tuple, int, float, bool)):
        return json_text(result, default=str)
    return valid_text(str(result))


def tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None):
    """Decorator: ``@tool`` or ``@tool(name=..., description=...)`` turns a function into a ``Tool``."""
    if fn is None:
        return lambda f: Tool(f, name=name, description=description)
    return Tool(fn, name=name, description=description)


class ToolSet:
    """Tools by name; dispatches parsed calls. Plain functions are wrapped with ``@tool``."""

    def __init__(self, tools: Iterable[Tool | Callable]) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            t = t if isinstance(t, Tool) else Tool(t)
            if t.name in self._tools:
                raise ConfigError(f"duplicate tool name {t.name!r} in ToolSet")
            self._tools[t.name] = t

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict]:
        return [t.schema() for t in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    async def call(self, call: ToolCall) -> str:
        """Validate and run one call. ToolCallError for the model's mistakes; tool exceptions propagate."""
        t = self._tools.get(call.name)
        if t is None:
            avail = ", ".join(self._tools) or "(none)"
            raise ToolCallError(f"unknown tool {call.name!r}; available tools: {avail}", kind="unknown_tool")
        return await t(**t.validate(call.arguments))
