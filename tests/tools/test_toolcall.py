"""Tool-call parsers: valid calls, malformed ones reported for the model, content kept."""

from __future__ import annotations

import json

import pytest
from scaling import cost_ratio

from agentrl.errors import ConfigError, ToolCallError
from agentrl.tools.calls import (
    MAX_ATTEMPTS,
    PARSERS,
    ParsedTurn,
    ToolCall,
    get_parser,
    parse_hermes,
    parse_python_block,
)


def test_hermes_single_call_and_content():
    text = 'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(2)"}}\n</tool_call>'
    p = parse_hermes(text)
    assert p == ParsedTurn(
        content="Let me compute.", calls=[ToolCall("python", {"code": "print(2)"}, "call_0")], errors=[]
    )


def test_hermes_multiple_calls_with_text_between():
    text = (
        'A <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> B\n'
        '<tool_call>{"name": "b", "arguments": {}}</tool_call> C'
    )
    p = parse_hermes(text)
    assert [(c.name, c.arguments, c.id) for c in p.calls] == [("a", {"x": 1}, "call_0"), ("b", {}, "call_1")]
    assert p.content == "A  B\n C" and p.errors == [] and p.n_attempts == 2


def test_hermes_no_calls():
    assert parse_hermes("  The answer is 4.  ") == ParsedTurn("The answer is 4.", [], [])


def test_hermes_arguments_as_json_string_and_aliases():
    text = (
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}</tool_call>'
        '<tool_call>{"name": "g", "parameters": {"q": "x"}}</tool_call>'
        '<tool_call>{"name": "h"}</tool_call>'
    )
    p = parse_hermes(text)
    assert [(c.name, c.arguments) for c in p.calls] == [("f", {"a": [1, 2]}), ("g", {"q": "x"}), ("h", {})]


@pytest.mark.parametrize(
    "body, needle",
    [
        ('{"name": "f", "arguments": {"x": 1}', "Invalid JSON"),
        ('{"arguments": {"x": 1}}', 'missing a "name"'),
        ('{"name": "f", "arguments": [1, 2]}', "must be a JSON object"),
        ('{"name": "f", "arguments": "not json"}', "not valid JSON"),
        ('{"name": "f", "arguments": "[1]"}', "must be a JSON object"),
        ('["f"]', "must hold a JSON object"),
        ('{"name": "f"} {"name": "g"}', "Extra text"),
        ("   ", "Empty <tool_call>"),
    ],
)
def test_hermes_malformed_calls_do_not_stop_others(body, needle):
    text = f'<tool_call>{body}</tool_call> then <tool_call>{{"name": "ok", "arguments": {{}}}}</tool_call>'
    p = parse_hermes(text)
    assert [c.name for c in p.calls] == ["ok"] and p.calls[0].id == "call_1"
    (err,) = p.errors
    assert isinstance(err, ToolCallError) and err.kind == "malformed" and needle in str(err)
    assert err.call_id == "call_0" and p.content == "then"


def test_hermes_error_quotes_a_snippet():
    p = parse_hermes('<tool_call>{"name": "calc", "arguments": {x: 1}}</tool_call>')
    assert "calc" in str(p.errors[0]) and "<tool_call>" in str(p.errors[0])  # quotes input, shows the format


def test_hermes_unclosed_tag():
    p = parse_hermes('Hi <tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "argu')
    assert [c.name for c in p.calls] == ["a"] and p.content == "Hi"
    assert "Unclosed <tool_call>" in str(p.errors[0]) and '"name": "b"' in str(p.errors[0])


def test_hermes_unclosed_tag_followed_by_another_call():
    p = parse_hermes('<tool_call>{"name": "a", "arguments": {}}\n<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert [c.name for c in p.calls] == ["b"] and p.calls[0].id == "call_1"
    assert "Unclosed" in str(p.errors[0]) and p.errors[0].call_id == "call_0"


def test_hermes_stray_closing_tag():
    p = parse_hermes('{"name": "a", "arguments": {}}</tool_call> done')
    assert p.calls == [] and "without a matching <tool_call>" in str(p.errors[0])


def test_hermes_long_snippet_is_truncated():
    p = parse_hermes("<tool_call>{" + "x" * 5000 + "</tool_call>")
    assert len(str(p.errors[0])) < 400


def test_python_blocks():
    text = "First:\n```python\nx = 1\nprint(x)\n```\nthen\n```py\nprint(2)\n```\n```bash\nls\n```"
    p = parse_python_block(text)
    assert [c.arguments["code"] for c in p.calls] == ["x = 1\nprint(x)", "print(2)"]
    assert [c.id for c in p.calls] == ["call_0", "call_1"] and all(c.name == "python" for c in p.calls)
    assert p.content == "First:\n\nthen\n\n```bash\nls\n```" and p.errors == []


def test_python_block_unclosed_is_an_error():
    p = parse_python_block("ok\n```python\nprint(1)\n```\nnow\n```python\nwhile True:\n  pass")
    assert len(p.calls) == 1 and p.content == "ok\n\nnow"
    assert p.errors[0].kind == "malformed" and "Unclosed ```python" in str(p.errors[0])


def test_python_block_none():
    assert parse_python_block("The answer is 3.") == ParsedTurn("The answer is 3.", [], [])


def test_get_parser():
    assert get_parser("hermes") is parse_hermes and get_parser("python_block") is parse_python_block
    assert set(PARSERS) == {"hermes", "python_block"}
    with pytest.raises(ConfigError, match=r"'xml'.*hermes, python_block"):
        get_parser("xml")


# ------------------------------------------------------------------ model output is data (issue 20)
def _call_with(arguments_json: str) -> str:
    return '<tool_call>{"name": "f", "arguments": ' + arguments_json + "}</tool_call>"


@pytest.mark.parametrize("depth", [200, 1000, 100_000])
def test_hermes_deep_arguments_are_a_malformed_call(depth):
    # json.loads recursed on this (RecursionError) although the parser promises never to raise
    p = parse_hermes("ok " + _call_with("[" * depth + "]" * depth))
    assert p.calls == [] and [e.kind for e in p.errors] == ["malformed"]
    assert "nested" in str(p.errors[0]) and p.content == "ok"


def test_hermes_deep_string_arguments_are_a_malformed_call():
    # "arguments" may be a JSON string holding the object: it is decoded too, under the same bound
    body = json.dumps({"name": "f", "arguments": '{"a": ' + "[" * 5000 + "]" * 5000 + "}"})
    p = parse_hermes("<tool_call>" + body + "</tool_call>")
    assert p.calls == [] and "nested" in str(p.errors[0])


def test_hermes_moderate_nesting_and_brackets_in_strings_still_parse():
    args = {"a": [[[[{"b": [1]}]]]], "code": "x = " + "[" * 500}
    p = parse_hermes(_call_with(json.dumps(args)))
    assert p.errors == [] and p.calls[0].arguments == args


def test_hermes_huge_integer_is_a_malformed_call():
    # int() of more than 4,300 digits raised ValueError out of the parser
    p = parse_hermes(_call_with('{"n": ' + "1" * 4301 + "}"))
    assert p.calls == [] and p.errors[0].kind == "malformed" and "digits" in str(p.errors[0])


def test_hermes_lone_surrogate_name_becomes_valid_text():
    p = parse_hermes('<tool_call>{"name": "\\ud83d", "arguments": {"k\\udc00": "v\\ud800"}}</tool_call>')
    assert p.calls[0].name == "\ufffd"
    p.calls[0].name.encode("utf-8")  # the name reaches tool messages and logs: must be valid UTF-8
    assert p.calls[0].arguments == {"k\udc00": "v\ud800"}  # arguments stay raw: tools may need them


@pytest.mark.parametrize(
    "make, n",
    [
        (lambda n: "<tool_call>" * n, 32_000),
        (lambda n: "</tool_call>" * n, 32_000),
        (lambda n: "<tool_call>{}" * n + "</tool_call>", 16_000),
    ],
    ids=["open", "close", "unclosed"],
)
def test_hermes_many_tags_take_linear_time(make, n):
    # the tag search rescanned to the end for every tag: 3-6 s here before. A cost ratio, not a wall
    # time (tests/scaling.py): 10x the tags cost 2-4x here (the parse stops at MAX_ATTEMPTS); a rescan
    # per tag ~100x
    text, tenth = make(n), make(n // 10)
    ratio = cost_ratio(lambda: parse_hermes(text), lambda: parse_hermes(tenth))
    assert ratio < 50, f"{n} tags cost {ratio:.0f}x {n // 10} tags"
    p = parse_hermes(text)
    assert p.n_attempts == MAX_ATTEMPTS + 1 and all(e.kind == "malformed" for e in p.errors)
    assert all(len(str(e)) < 400 for e in p.errors) and "More than 64" in str(p.errors[-1])


@pytest.mark.parametrize(
    "parse, one",
    [
        (parse_hermes, '<tool_call>{"name": "f", "arguments": {}}</tool_call>'),
        (parse_python_block, "```python\nprint(1)\n```\n"),
    ],
)
def test_call_attempts_per_turn_are_capped(parse, one):
    # every attempt becomes a tool message: 1,500 of them made a 200k-character observation
    p = parse(one * MAX_ATTEMPTS)
    assert len(p.calls) == MAX_ATTEMPTS and p.errors == []
    p = parse("a " + one * (MAX_ATTEMPTS + 500) + "tail")
    assert len(p.calls) == MAX_ATTEMPTS and [e.call_id for e in p.errors] == [f"call_{MAX_ATTEMPTS}"]
    assert "the rest of the turn was not read" in str(p.errors[0]) and p.content.endswith("tail")
