"""Typed async tools: a JSON schema derived from a function's signature and docstring.

Owns: ``Tool`` (schema + argument validation/coercion + async call), the ``@tool`` decorator and
``ToolSet`` (dispatch of a parsed ``ToolCall`` by name).

The schema is transformers' ``get_json_schema`` (what HF chat templates are given): the description
is the docstring's text before ``Args:``, a parameter's the text of its Google-style ``Args:``
entry (one ending ``(choices: ["a", "b"])`` makes an enum, which validation holds to); the
annotations are the ones it supports (``str``, ``int``, ``float``, ``bool``, ``list[T]``,
``tuple[A, B]``, ``dict`` / ``dict[str, T]``, ``Optional[T]`` / ``T | None``, ``Literal[...]``,
``Enum``). Where agentrl differs: a function without a docstring, or an argument the docstring
does not describe, is still a tool, with no description there (transformers refuses both); no
annotation means anything (``{}``; transformers refuses it); a parameter with a JSON-able default
shows it as ``"default"``; and ``Optional[T]`` is JSON Schema's null type (``["string", "null"]``),
not OpenAPI's ``"nullable"``. Parameters with defaults are not required. transformers (and torch,
which ``get_json_schema`` imports) load with the first tool built, not with this module.

Arguments are validated and coerced by pydantic in its lax mode (``"5"`` is 5, ``2.0`` is 2,
``"yes"`` and 1 are true), except that JSON true/false is never a number.

Does not: parse tool calls out of text (``agentrl.tools.calls``), sandbox anything, or enforce
deadlines (the episode manager wraps calls in its own timeout). Mistakes of the *model* (unknown
tool, bad arguments) raise ``ToolCallError``, whose message is meant to be shown to the model (its
wording is ours, not pydantic's); any other exception raised by the tool function propagates
unchanged — the env decides whether it is the model's fault or an infrastructure failure.
Validation never raises anything else on a model's values: an integer string past
``MAX_INT_DIGITS`` is a bad argument, and a value too deep to render shows as its type in the
message.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import json
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, TypeAdapter, ValidationError
from pydantic.errors import PydanticSchemaGenerationError

from agentrl.errors import ConfigError, ToolCallError
from agentrl.tools.calls import ToolCall
from agentrl.trajectory import json_text, valid_text

_NONE = type(None)
_JSON_DEFAULTS = (str, int, float, bool, list, dict)
#: longest integer string a tool argument may be (pydantic's limit, and Python's default int/str one)
MAX_INT_DIGITS = 4300
_WORDS = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "a list",
    tuple: "a list",
    dict: "an object",
    _NONE: "null",
}


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


# ---------------------------------------------------------------- JSON schema: transformers' get_json_schema
def _hf_function(doc: str, params: list[inspect.Parameter]) -> dict:
    """``get_json_schema(f)["function"]`` for a stand-in ``f`` taking ``params`` (all annotated)
    whose docstring is ``doc``."""
    # transformers takes a second to import, and get_json_schema imports torch: both wait for a tool
    from transformers.utils import get_json_schema

    def stand_in() -> None: ...

    stand_in.__doc__ = doc
    stand_in.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    stand_in.__annotations__ = {p.name: p.annotation for p in params}
    return get_json_schema(stand_in)["function"]


def _hf_schema(tool: str, doc: str, params: list[inspect.Parameter]) -> tuple[str, dict[str, dict]]:
    """(description, properties) from ``get_json_schema`` for a function with docstring ``doc`` taking
    ``params`` (all annotated). It refuses an undescribed argument or no docstring; then it is asked
    one parameter at a time, with a stand-in docstring for those it lacks, and these go without a
    description."""
    from transformers.utils import DocstringParsingException, TypeHintParsingException  # see _hf_function

    def alone(p: inspect.Parameter) -> dict:
        try:
            return _hf_function(doc, [p])["parameters"]["properties"][p.name]
        except DocstringParsingException:
            return _hf_function(f"-\n\nArgs:\n    {p.name}:", [p])["parameters"]["properties"][p.name]

    try:
        try:
            function = _hf_function(doc, params)
            return function["description"], function["parameters"]["properties"]
        except DocstringParsingException:
            return _hf_function(doc, [])["description"] if doc else "", {p.name: alone(p) for p in params}
    except TypeHintParsingException as e:
        raise TypeError(f"tool {tool!r}: unsupported annotation: {e}") from None


def _property(prop: dict, default: Any) -> dict:
    """A property as ``get_json_schema`` made it, with null as a type, no empty description, and
    ``default`` if JSON-able."""
    description = prop.pop("description", "")
    prop = _null_as_type(prop)
    if description:
        prop["description"] = description
    if default is None or (default is not inspect.Parameter.empty and isinstance(default, _JSON_DEFAULTS)):
        prop["default"] = default
    return prop


def _null_as_type(prop: dict) -> dict:
    """transformers marks ``Optional[T]`` with OpenAPI's ``"nullable": true``; JSON Schema (which API
    models and validators read) makes null one of the types."""
    if not prop.pop("nullable", False):
        return prop
    if set(prop) == {"type"}:
        kinds = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
        return {"type": [*kinds, "null"]}
    return {"anyOf": [*(prop["anyOf"] if set(prop) == {"anyOf"} else [prop]), {"type": "null"}]}


# ---------------------------------------------------------------- validation: pydantic
def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("JSON true/false is not a number")
    return value


def _bools_not_numbers(tp: Any) -> Any:
    """``tp`` with JSON true/false refused where a number (or a non-boolean ``Literal``) is asked
    for: pydantic's lax mode reads them as 1 and 0."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in (int, float) or (origin is Literal and not any(isinstance(a, bool) for a in args)):
        return Annotated[tp, BeforeValidator(_not_bool)]
    if origin is Union or origin is types.UnionType:
        return Union[tuple(_bools_not_numbers(a) for a in args)]  # noqa: UP007 - X | Y takes no tuple
    if origin in (list, tuple, dict) and args:
        return origin[tuple(_bools_not_numbers(a) for a in args)]
    return tp


@functools.lru_cache(maxsize=512)
def _adapter(tp: Any) -> TypeAdapter:
    """pydantic's validator for an annotation (cached: an env builds its tools anew per episode)."""
    return TypeAdapter(_bools_not_numbers(tp))


def _first_error(tp: Any, value: Any) -> dict:
    """pydantic's first complaint about ``value`` as a ``tp`` (``value`` is known not to fit)."""
    try:
        _adapter(tp).validate_python(value)
    except ValidationError as e:
        return e.errors(include_url=False)[0]
    return {"type": "", "loc": ()}


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def _expected(tp: Any, value: Any) -> str:
    """What ``tp`` asks for, in the words the model is shown, given the ``value`` that did not fit."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union or origin is types.UnionType:
        return " or ".join(_expected(a, value) for a in args if a is not _NONE)
    if origin is Literal or _is_enum(tp):
        choices = args if origin is Literal else [member.value for member in tp]
        return "one of " + ", ".join(json.dumps(c) for c in choices)
    if origin is tuple and args:  # get_json_schema takes only fixed-length ones
        return "a list [" + ", ".join(_expected(a, None) for a in args) + "]"
    loc = _first_error(tp, value)["loc"] if origin in (list, dict) and args else ()
    if origin is list and loc:  # an item of a list
        item = value[loc[0]]
        return f"a list whose items are {_expected(args[0], item)} (item {loc[0]} is {_json_type(item)} {_show(item)})"
    if origin is dict and loc:  # a value of an object
        return _expected(args[-1], value[loc[0]])
    if tp is int and isinstance(value, str) and _first_error(tp, value)["type"] == "int_parsing_size":
        return f"an integer of at most {MAX_INT_DIGITS} digits"
    return _WORDS.get(origin or tp, "a value of another kind")


# ---------------------------------------------------------------- Tool / @tool / ToolSet
class Tool:
    """An async-callable tool with a JSON schema; build it with ``@tool``."""

    def __init__(self, fn: Callable, *, name: str | None = None, description: str | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        try:
            hints = typing.get_type_hints(fn)
        except Exception as e:  # a forward reference we cannot resolve is a bug in the tool's module
            raise TypeError(f"tool {self.name!r}: cannot resolve annotations: {e}") from e
        params = list(inspect.signature(fn).parameters.values())
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"tool {self.name!r}: *args/**kwargs cannot be described by a JSON schema")
            if p.kind is p.POSITIONAL_ONLY:
                raise TypeError(f"tool {self.name!r}: positional-only parameter {p.name!r} cannot take a keyword")
        self._types: dict[str, Any] = {p.name: hints.get(p.name, Any) for p in params}
        doc = inspect.getdoc(fn) or ""
        annotated = [p.replace(annotation=self._types[p.name]) for p in params]
        doc_description, hf_props = _hf_schema(self.name, doc, annotated)
        self.description = description if description is not None else doc_description
        props = {p.name: _property(hf_props[p.name], p.default) for p in params}
        for key, prop in props.items():  # an Args: entry ending "(choices: [...])" made an enum: hold to it
            tp = self._types[key]
            if "enum" in prop and typing.get_origin(tp) is not Literal and not _is_enum(tp):
                self._types[key] = Literal[tuple(prop["enum"])]
        self._required = [p.name for p in params if p.default is p.empty]
        self.parameters: dict = {"type": "object", "properties": props, "required": self._required}
        try:
            self._adapters = {key: _adapter(tp) for key, tp in self._types.items()}
        except PydanticSchemaGenerationError as e:
            raise TypeError(f"tool {self.name!r}: unsupported annotation: {str(e).splitlines()[0]}") from None
        # `x: dict = None` is a common idiom: an explicit null means "use the default".
        self._none_ok = {p.name for p in params if p.default is None}

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
                out[key] = self._adapters[key].validate_python(value)
            except ValidationError:
                expected, got = _expected(self._types[key], value), f"{_json_type(value)} {_show(value)}"
                raise ToolCallError(
                    f"argument {key!r} of tool {self.name!r} must be {expected}, got {got}",
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
