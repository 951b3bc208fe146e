"""`agentrl serve` in the Anthropic Messages and OpenAI Responses dialects, through the official
`anthropic` and `openai` clients, unmodified: tools, multi-turn with tool results, streaming,
``previous_response_id``, stop reasons, and errors in each dialect's shape naming the field.

Two servers, as in test_conformance: the serve app over a scripted engine
(tests/scripted_chat.py; its replies call tools, so the tool paths run deterministically, and it
logs what it sampled), and the real local backend on the tiny model, where each dialect must render
exactly the prompt the chat endpoint renders and answer with exactly the ids it samples.
"""

from __future__ import annotations

import re

import anthropic
import httpx
import openai
import pytest
from scripted_chat import TOOL_SCHEMA, ScriptedChatEngine, served

from agentrl.jobs.serve import LocalServer, resolve_target

TOOLU = re.compile(r"toolu_[0-9a-f]{24}")
CALL_ID = re.compile(r"call_[0-9a-f]{24}")
A_TOOLS = [{"name": "python", "description": "Run Python code.", "input_schema": TOOL_SCHEMA}]
R_TOOLS = [{"type": "function", "name": "python", "description": "Run Python code.", "parameters": TOOL_SCHEMA}]
C_TOOLS = [
    {"type": "function", "function": {"name": "python", "description": "Run Python code.", "parameters": TOOL_SCHEMA}}
]
ASK = "What is 6 * 7?"


@pytest.fixture(scope="module")
def scripted(tiny_tokenizer):
    """(base URL, engine) of the serve app over the scripted engine."""
    from agentrl.serving.api import OpenAIAPI
    from agentrl.serving.app import build_app

    engine = ScriptedChatEngine(tiny_tokenizer)
    with served(build_app(OpenAIAPI(engine, tiny_tokenizer, "scripted"))) as url:
        yield url, engine


def _anthropic(url):
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


def _openai(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _sampled(engine, extra) -> None:
    """The answer's ``agentrl`` ids are the engine's last sample, prompt and completion."""
    prompt, g = engine.log[-1]
    assert extra["token_ids"] == g.token_ids and extra["prompt_token_ids"] == prompt
    assert extra["logprobs"] == g.logprobs


# ------------------------------------------------------------------------------------- Anthropic
def test_messages_tool_use_then_tool_result_renders_as_chat(scripted):
    url, engine = scripted
    client = _anthropic(url)
    first = client.messages.create(
        model="scripted", max_tokens=64, system="Be brief.", messages=[{"role": "user", "content": ASK}], tools=A_TOOLS
    )
    assert first.stop_reason == "tool_use" and first.type == "message" and first.role == "assistant"
    text, use = first.content
    assert text.type == "text" and text.text == "Let me compute it."
    assert use.type == "tool_use" and TOOLU.fullmatch(use.id) and use.name == "python"
    assert use.input == {"code": "print(6 * 7)"}
    _sampled(engine, first.model_extra["agentrl"])
    assert first.usage.output_tokens == len(engine.log[-1][1].token_ids)
    assert first.usage.input_tokens == len(engine.log[-1][0])
    turns = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]},
    ]
    second = client.messages.create(model="scripted", max_tokens=64, system="Be brief.", messages=turns, tools=A_TOOLS)
    assert second.stop_reason == "end_turn" and second.content[0].text == "The answer is 42."
    _sampled(engine, second.model_extra["agentrl"])
    # the same conversation through the chat endpoint: the very same prompt ids
    chat = _openai(url).chat.completions.create(
        model="scripted",
        max_tokens=64,
        tools=C_TOOLS,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": ASK},
            {
                "role": "assistant",
                "content": "Let me compute it.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "python", "arguments": '{"code": "print(6 * 7)"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
    )
    assert (
        chat.choices[0].model_extra["agentrl"]["prompt_token_ids"] == second.model_extra["agentrl"]["prompt_token_ids"]
    )


def test_messages_stream_sends_the_real_event_sequence(scripted):
    url, engine = scripted
    with _anthropic(url).messages.stream(
        model="scripted", max_tokens=64, messages=[{"role": "user", "content": ASK}], tools=A_TOOLS
    ) as stream:
        events = [e.type for e in stream if e.type not in ("text", "input_json")]  # the helper's own events
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    assert events[1:4] == ["content_block_start", "content_block_delta", "content_block_delta"]
    assert events.count("content_block_start") == events.count("content_block_stop") == 2
    assert final.stop_reason == "tool_use" and final.content[0].text.strip() == "Let me compute it."
    use = final.content[1]
    assert TOOLU.fullmatch(use.id) and use.input == {"code": "print(6 * 7)"}
    assert final.usage.output_tokens == len(engine.log[-1][1].token_ids) and final.usage.input_tokens > 0


def test_messages_stop_sequence_and_max_tokens(scripted):
    url, _ = scripted
    client = _anthropic(url)
    msgs = [{"role": "user", "content": ASK}]
    cut = client.messages.create(model="scripted", max_tokens=64, messages=msgs, stop_sequences=["compute"])
    assert (cut.stop_reason, cut.stop_sequence, cut.content[0].text) == ("stop_sequence", "compute", "Let me ")
    short = client.messages.create(model="scripted", max_tokens=3, messages=msgs)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    streamed = client.messages.create(
        model="scripted", max_tokens=64, messages=msgs, stop_sequences=["it."], stream=True
    )
    delta = [e for e in streamed if e.type == "message_delta"][0]
    assert (delta.delta.stop_reason, delta.delta.stop_sequence) == ("stop_sequence", "it.")


def test_messages_errors_in_anthropics_shape_name_the_field(scripted):
    url, _ = scripted
    client = _anthropic(url)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.BadRequestError, match="temperature") as e:
        client.messages.create(model="scripted", max_tokens=8, messages=msgs, extra_body={"temperature": 3})
    assert e.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": e.value.body["error"]["message"]},
    }
    with pytest.raises(anthropic.NotFoundError, match="not served here"):
        client.messages.create(model="claude-x", max_tokens=8, messages=msgs)
    with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]"):
        client.messages.create(model="scripted", max_tokens=8, messages=msgs, tools=[{"name": "python"}])
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\].content\[0\]: 'image'"):
        client.messages.create(
            model="scripted", max_tokens=8, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]
        )
    r = httpx.post(f"{url}/v1/messages", json={"model": "scripted", "messages": msgs})
    assert r.status_code == 400 and r.json()["error"]["message"] == "max_tokens is required"


# ------------------------------------------------------------------------------------- Responses
def test_responses_function_call_output_and_previous_response_id(scripted):
    url, engine = scripted
    client = _openai(url)
    first = client.responses.create(model="scripted", input=ASK, tools=R_TOOLS, instructions="Be brief.")
    assert first.status == "completed" and first.output_text == "Let me compute it."
    msg, call = first.output
    assert msg.type == "message" and call.type == "function_call" and CALL_ID.fullmatch(call.call_id)
    assert call.name == "python" and call.arguments == '{"code": "print(6 * 7)"}'
    _sampled(engine, first.model_extra["agentrl"])
    output = [{"type": "function_call_output", "call_id": call.call_id, "output": "42"}]
    chained = client.responses.create(
        model="scripted", previous_response_id=first.id, input=output, tools=R_TOOLS, instructions="Be brief."
    )
    assert chained.output_text == "The answer is 42." and chained.previous_response_id == first.id
    _sampled(engine, chained.model_extra["agentrl"])
    # the whole history sent as items instead: the same prompt
    items = [{"role": "user", "content": ASK}, *[i.model_dump(exclude_none=True) for i in first.output], *output]
    explicit = client.responses.create(model="scripted", input=items, tools=R_TOOLS, instructions="Be brief.")
    ids = explicit.model_extra["agentrl"]["prompt_token_ids"]
    assert ids == chained.model_extra["agentrl"]["prompt_token_ids"]
    assert chained.usage.input_tokens == len(ids) and chained.usage.output_tokens == len(engine.log[-1][1].token_ids)


def test_responses_stream_events(scripted):
    url, engine = scripted
    client = _openai(url)
    events = list(client.responses.create(model="scripted", input=ASK, tools=R_TOOLS, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip() == "Let me compute it." and kinds.count("response.output_text.delta") >= 3
    args = [e for e in events if e.type == "response.function_call_arguments.done"][0]
    assert args.arguments == '{"code": "print(6 * 7)"}'
    final = events[-1].response
    assert [i.type for i in final.output] == ["message", "function_call"]
    assert kinds.index("response.function_call_arguments.delta") > kinds.index("response.output_item.done")
    _sampled(engine, final.model_extra["agentrl"])
    # a streamed response is kept like a whole one
    call = final.output[1]
    out = [{"type": "function_call_output", "call_id": call.call_id, "output": "42"}]
    nxt = client.responses.create(model="scripted", previous_response_id=final.id, input=out, tools=R_TOOLS)
    assert nxt.output_text == "The answer is 42."


def test_responses_errors_name_the_field(scripted):
    url, _ = scripted
    client = _openai(url)
    with pytest.raises(openai.BadRequestError, match="previous response 'resp_nope' was not found") as e:
        client.responses.create(model="scripted", input="hi", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]"):
        client.responses.create(model="scripted", input="hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match=r"input\[0\].type='reasoning'"):
        client.responses.create(model="scripted", input=[{"type": "reasoning", "summary": []}])
    with pytest.raises(openai.BadRequestError, match="max_output_tokens"):
        client.responses.create(model="scripted", input="hi", max_output_tokens=0)
    short = client.responses.create(model="scripted", input="hi", max_output_tokens=2)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"


# ------------------------------------------------------------------------------------- tiny model
def test_tiny_model_answers_each_dialect_as_the_chat_endpoint(tiny_model_dir):
    """Greedy, the same question through chat, Messages and Responses: the same prompt ids, the same
    sampled ids; a stream carries the same text."""
    with LocalServer(resolve_target(tiny_model_dir), port=0, name="tiny", log=lambda m: None) as server:
        msgs = [{"role": "user", "content": "Say something"}]
        chat = _openai(server.url).chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0)
        want = chat.choices[0].model_extra["agentrl"]
        a = _anthropic(server.url)
        msg = a.messages.create(model="tiny", max_tokens=12, messages=msgs, extra_body={"temperature": 0})
        got = msg.model_extra["agentrl"]
        assert (got["prompt_token_ids"], got["token_ids"]) == (want["prompt_token_ids"], want["token_ids"])
        assert "".join(b.text for b in msg.content) == chat.choices[0].message.content
        with a.messages.stream(model="tiny", max_tokens=12, messages=msgs, extra_body={"temperature": 0}) as s:
            assert s.get_final_text() == chat.choices[0].message.content
        resp = _openai(server.url).responses.create(
            model="tiny", input="Say something", max_output_tokens=12, temperature=0
        )
        got = resp.model_extra["agentrl"]
        assert (got["prompt_token_ids"], got["token_ids"]) == (want["prompt_token_ids"], want["token_ids"])
        assert resp.output_text == chat.choices[0].message.content


def test_the_response_store_keeps_the_newest():
    from agentrl.serving.dialects import ResponseStore

    store = ResponseStore(limit=2)
    for k in ("a", "b", "c"):
        store[k] = [{"role": "user", "content": k}]
    assert list(store) == ["b", "c"] and "a" not in store
