"""TextDeltas (what a stream may send as tokens arrive) and the reply plan of tool_choice /
response_format: pure units, no server."""

from __future__ import annotations

import json

import pytest

from agentrl.serving.errors import APIError
from agentrl.serving.reply import build_message, call_id, plan_reply
from agentrl.serving.stream import TextDeltas

TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object", "properties": {}}}}]


def feed(pieces: list[str], stops=(), hold=()) -> tuple[list[str], TextDeltas]:
    """Each piece is one "token" (decode = join of the pieces so far)."""
    d = TextDeltas(lambda ids: "".join(pieces[i] for i in ids), list(stops), list(hold))
    out = [d.push(i) for i in range(len(pieces))]
    return out + [d.finish()], d


def test_text_is_released_as_it_comes():
    out, d = feed(["Hel", "lo", " world"])
    assert out == ["Hel", "lo", " world", ""] and d.text == "Hello world" and not d.stopped


def test_a_possible_stop_string_is_held_back_until_known():
    out, d = feed(["ab", "<", "x", "yz"], stops=["<END>"])
    assert out == ["ab", "", "<x", "yz", ""]  # "<" could have begun "<END>"
    out, d = feed(["ab", "<E", "ND>", "more"], stops=["<END>"])
    assert "".join(out) == "ab" and d.stopped and d.text == "ab"


def test_incomplete_utf8_is_held_back():
    parts = [b"caf", b"\xc3", b"\xa9!"]  # "é" split across two tokens
    d = TextDeltas(lambda ids: b"".join(parts[i] for i in ids).decode("utf-8", "replace"), [], [])
    assert [d.push(i) for i in range(3)] + [d.finish()] == ["caf", "", "é!", ""]


def test_tool_call_marker_holds_the_rest():
    out, d = feed(["Sure. ", "<tool", "_call>", '{"name"', "}</tool_call>"], hold=["<tool_call>"])
    assert "".join(out) == "Sure. " and d.held and d.rest.startswith("<tool_call>")


def test_plan_reply_modes():
    assert plan_reply({}).tools is None and not plan_reply({}).constrained
    auto = plan_reply({"tools": TOOLS})
    assert auto.tools == TOOLS and auto.parse_tools and not auto.constrained
    none = plan_reply({"tools": TOOLS, "tool_choice": "none"})
    assert none.tools is None and not none.parse_tools
    req = plan_reply({"tools": TOOLS, "tool_choice": "required"})
    assert req.prefix == "<tool_call>\n" and req.require_call == "*" and req.constrained
    named = plan_reply({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "python"}}})
    assert named.prefix.endswith('{"name": "python", "arguments": ') and named.require_call == "python"
    assert plan_reply({"response_format": {"type": "json_object"}}).prefix == "{"
    assert plan_reply({"tools": TOOLS, "response_format": {"type": "json_object"}}).prefix == ""  # may call a tool
    with pytest.raises(APIError, match="tools\\[0\\]"):
        plan_reply({"tools": [{"type": "function"}]})


def test_build_message_checks_the_plan_and_makes_unique_ids():
    req = plan_reply({"tools": TOOLS, "tool_choice": "required"})
    text = '<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>'
    msg, finish, problem = build_message(req, text, "stop")
    assert problem is None and finish == "tool_calls" and msg["content"] is None
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"code": "1"}
    again, _, _ = build_message(req, text, "stop")
    assert again["tool_calls"][0]["id"] != msg["tool_calls"][0]["id"] != call_id()
    assert "not a well-formed tool call" in build_message(req, "<tool_call>\n{oops", "length")[2]
    wrong = text.replace('"python"', '"ruby"')
    assert "ruby" in build_message(req, wrong, "stop")[2]
    fmt = plan_reply({"response_format": {"type": "json_object"}})
    assert build_message(fmt, '{"a": 1}', "stop")[2] is None
    assert "not an object" in build_message(fmt, "[1]", "stop")[2]
    assert "not JSON" in build_message(fmt, "{nope", "stop")[2]
