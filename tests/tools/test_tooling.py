"""Typed tools: schema from signature + docstring, validation/coercion, async dispatch."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Literal

import pytest

from agentrl.envs.textworld.env import TextWorldEnv
from agentrl.errors import ConfigError, ToolCallError
from agentrl.tools.base import Tool, ToolSet, tool
from agentrl.tools.bash import make_bash_tool
from agentrl.tools.calls import ToolCall
from agentrl.tools.python import make_python_tool
from agentrl.warmstart.tiny_model import build_tokenizer


@tool
async def search(query: str, k: int = 3, lang: Literal["en", "de"] = "en", site: str | None = None) -> list:
    """Search the index for documents.

    Only the local index; never the web.

    Args:
        query: What to look for.
        k (int): How many results
            to return.
        lang: Result language.
        site: Restrict to one site.

    Returns:
        The hits.
    """
    return [f"{query}:{i}:{lang}:{site}" for i in range(k)]


@tool(name="calc", description="Evaluate arithmetic.")
def calculator(values: list[float], scale: float | None = None, exact: bool = False, meta: dict = None):
    return {"sum": sum(values) * (scale or 1), "thread": threading.current_thread().name, "exact": exact}


def test_schema_from_signature_and_docstring():
    s = search.schema()
    assert s["type"] == "function"
    f = s["function"]
    # transformers' get_json_schema: the description is all the text before Args:
    assert f["name"] == "search"
    assert f["description"] == "Search the index for documents.\n\nOnly the local index; never the web."
    props = f["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["k"] == {"type": "integer", "description": "How many results to return.", "default": 3}
    assert props["lang"]["enum"] == ["en", "de"] and props["lang"]["type"] == "string"
    assert props["site"]["type"] == ["string", "null"]
    assert f["parameters"]["required"] == ["query"] and f["parameters"]["type"] == "object"


def test_decorator_overrides_and_container_types():
    assert (
        isinstance(calculator, Tool) and calculator.name == "calc" and calculator.description == "Evaluate arithmetic."
    )
    props = calculator.parameters["properties"]
    assert props["values"] == {"type": "array", "items": {"type": "number"}}
    assert props["scale"]["type"] == ["number", "null"] and props["meta"]["type"] == "object"
    assert calculator.parameters["required"] == ["values"]


def test_validate_coerces():
    assert search.validate({"query": "x", "k": "5"}) == {"query": "x", "k": 5}
    assert search.validate({"query": "x", "k": 2.0, "site": None}) == {"query": "x", "k": 2, "site": None}
    assert calculator.validate({"values": [1, "2.5"], "exact": "true"}) == {"values": [1.0, 2.5], "exact": True}
    assert calculator.validate({"values": [], "meta": None}) == {"values": [], "meta": None}  # default None
    # pydantic's lax mode reads 1 and "yes" as true; JSON true/false is never a number
    assert calculator.validate({"values": [], "exact": 1}) == {"values": [], "exact": True}
    assert calculator.validate({"values": [], "exact": "yes"}) == {"values": [], "exact": True}
    with pytest.raises(ToolCallError, match="must be a list whose items are a number .item 0 is boolean true"):
        calculator.validate({"values": [True]})


@pytest.mark.parametrize(
    "args, needle",
    [
        ({}, "missing required argument 'query'"),
        ({"query": "x", "limit": 3}, "unexpected argument 'limit'"),
        ({"query": 5}, "argument 'query' of tool 'search' must be a string, got integer 5"),
        ({"query": "x", "k": "many"}, "'k' of tool 'search' must be an integer"),
        ({"query": "x", "k": True}, "must be an integer, got boolean"),
        ({"query": "x", "lang": "fr"}, 'must be one of "en", "de"'),
    ],
)
def test_validate_errors_name_the_argument(args, needle):
    with pytest.raises(ToolCallError) as e:
        search.validate(args)
    assert e.value.kind == "bad_arguments" and needle in str(e.value)


def test_literal_unions_and_nested_errors():
    @tool
    def pick(level: Literal[1, 2], tags: list[int] | None = None, pair: int | str = 0, m: dict[str, int] = None):
        """Pick.

        Args:
            pair: A pair (choices: [0, "a"])
        """

    props = pick.parameters["properties"]
    assert props["tags"] == {
        "anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}],
        "default": None,
    }
    assert props["pair"] == {"type": ["integer", "string"], "enum": [0, "a"], "description": "A pair", "default": 0}
    assert props["level"] == {"type": "integer", "enum": [1, 2]} and "description" not in props["tags"]
    assert pick.validate({"level": 2, "tags": ["3"]}) == {"level": 2, "tags": [3]}
    for args, message in [
        ({"level": True}, "must be one of 1, 2, got boolean true"),
        ({"level": 1, "tags": [1, "x"]}, 'must be a list whose items are an integer (item 1 is string "x")'),
        ({"level": 1, "pair": "b"}, 'must be one of 0, "a", got string "b"'),
        ({"level": 1, "m": {"a": "b"}}, 'must be an integer, got object {"a": "b"}'),
    ]:
        with pytest.raises(ToolCallError) as e:
            pick.validate(args)
        assert message in str(e.value)


def test_builtin_tool_schemas_are_pinned():
    # the text the model is shown: what the hand-written schema code made before get_json_schema did it
    class Fresh:
        persistent = False

    python = make_python_tool(Fresh())
    assert json.dumps(python.schema()) == (
        '{"type": "function", "function": {"name": "python", "description": "Run a Python 3 program and return its '
        "stdout and stderr. Nothing persists between calls: each call is a fresh process in a fresh directory, so "
        'print() what you need to see.", "parameters": {"type": "object", "properties": {"code": {"type": "string", '
        '"description": "The complete program to run."}}, "required": ["code"]}}}'
    )
    assert json.dumps(make_bash_tool(Fresh()).schema()["function"]["parameters"]) == (
        '{"type": "object", "properties": {"command": {"type": "string", "description": "The bash commands to run."}}, '
        '"required": ["command"]}'
    )
    textworld = {t.name: t.schema()["function"] for t in TextWorldEnv().tools}
    assert json.dumps(textworld["look"]) == (
        '{"name": "look", "description": "Describe the room you are in: receptacles (with the contents of open ones) '
        'and exits.", "parameters": {"type": "object", "properties": {}, "required": []}}'
    )
    assert json.dumps(textworld["put"]["parameters"]) == (
        '{"type": "object", "properties": {"obj": {"type": "string", "description": "the object you hold, e.g. '
        '\\"mug 1\\""}, "receptacle": {"type": "string", "description": "where to put it, e.g. \\"cabinet 2\\""}}, '
        '"required": ["obj", "receptacle"]}'
    )


def test_validate_list_item_error_names_index():
    with pytest.raises(ToolCallError, match=r"'values'.*item 1 is string"):
        calculator.validate({"values": [1, "abc"]})


async def test_async_and_sync_tools_run():
    assert await search(query="q", k=2) == '["q:0:en:None", "q:1:en:None"]'
    out = await calculator(values=[1.0, 2.0])
    assert '"sum": 3.0' in out and threading.current_thread().name not in out  # ran in a worker thread


async def test_toolset_dispatch():
    ts = ToolSet([search, calculator])
    assert ts.names == ["search", "calc"] and "calc" in ts and "nope" not in ts and ts.get("search") is search
    assert [s["function"]["name"] for s in ts.schemas()] == ["search", "calc"]
    assert await ts.call(ToolCall("search", {"query": "a", "k": "1"})) == '["a:0:en:None"]'
    with pytest.raises(ToolCallError) as e:
        await ts.call(ToolCall("nope", {}))
    assert e.value.kind == "unknown_tool" and "search, calc" in str(e.value)
    with pytest.raises(ToolCallError) as e:
        await ts.call(ToolCall("search", {"q": "a"}))
    assert e.value.kind == "bad_arguments"


async def test_tool_exceptions_propagate_unchanged():
    boom = RuntimeError("sandbox exploded")

    @tool
    async def explode() -> str:
        """Always fails."""
        raise boom

    @tool
    def explode_sync(x: int = 0) -> str:
        raise boom

    ts = ToolSet([explode, explode_sync])
    for name in ("explode", "explode_sync"):
        with pytest.raises(RuntimeError) as e:
            await ts.call(ToolCall(name, {}))
        assert e.value is boom


async def test_sync_tools_do_not_block_the_loop():
    @tool
    def slow() -> str:
        threading.Event().wait(0.2)
        return "done"

    ticks = 0

    async def ticker():
        nonlocal ticks
        for _ in range(10):
            await asyncio.sleep(0.01)
            ticks += 1

    result, _ = await asyncio.gather(slow(), ticker())
    assert result == "done" and ticks == 10


def test_bad_definitions():
    with pytest.raises(TypeError, match="unsupported annotation"):

        @tool
        def f(x: set): ...

    with pytest.raises(TypeError, match=r"\*args"):

        @tool
        def g(*args: int): ...

    with pytest.raises(ConfigError, match="duplicate tool name 'search'"):
        ToolSet([search, search])


def test_plain_functions_are_wrapped_and_unannotated_accepts_anything():
    def echo(x, y: int = 1):
        """Echo x."""
        return x

    ts = ToolSet([echo])
    assert ts.get("echo").parameters["properties"]["x"] == {}
    assert ts.get("echo").validate({"x": [1, {"a": 2}]}) == {"x": [1, {"a": 2}]}


def test_schemas_render_in_qwen_template():
    tok = build_tokenizer(None)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        tools=ToolSet([search, calculator]).schemas(),
        add_generation_prompt=True,
        tokenize=False,
    )
    assert '"name": "calc"' in text and "How many results to return." in text


# ------------------------------------------------------------------ model output is data (issue 20)
def test_huge_integer_strings_are_bad_arguments_not_a_crash():
    # int("1" * 4301) raised ValueError out of validate
    with pytest.raises(ToolCallError, match=r"argument 'k' of tool 'search' must be an integer.*4300 digits") as ei:
        search.validate({"query": "q", "k": "1" * 4301})
    assert ei.value.kind == "bad_arguments" and len(str(ei.value)) < 400
    assert search.validate({"query": "q", "k": " -" + "9" * 4300})["k"] == -int("9" * 4300)


def test_error_messages_survive_unprintable_values():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ToolCallError, match="must be a string, got array"):
        search.validate({"query": deep})


def test_tool_output_is_valid_text():
    # a tool echoing a model's "\ud83d" argument made an observation the tokenizer and the log refuse
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    @tool
    def echo_json(text: str) -> dict:
        """Echo as JSON."""
        return {"text": text}

    for t in (echo, echo_json):
        out = asyncio.run(t(**t.validate({"text": "a\ud83d b\ud83d\ude00"})))
        assert "\ufffd" in out and "\U0001f600" in out
        out.encode("utf-8")
