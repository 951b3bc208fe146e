"""The recording endpoint in the Anthropic Messages and OpenAI Responses dialects, driven by the
official `anthropic` and `openai` clients, unmodified: an unbroken conversation (tool call, tool
result, answer; whole or streamed) is one trajectory whose sampled runs are exactly the engine's
samples after exactly the prompts it was given, the second prompt built from the render delta; a
rewritten history starts a new segment; a key is checked (``x-api-key`` for Anthropic's client) and
refused in the dialect's shape; a ``previous_response_id`` resolves only within its episode; and
what the proxy cannot record faithfully is refused as in chat.

The endpoint is the run's (``ProxyEndpoint`` as ``agentrl.jobs.build`` builds it), the
engine a scripted one (tests/scripted_chat.py) whose replies call a tool."""

from __future__ import annotations

import secrets

import anthropic
import openai
import pytest
from scripted_chat import TOOL_SCHEMA, ScriptedChatEngine

from agentrl.agents.proxy import Budget, EpisodeLink, ProxyEndpoint

A_TOOLS = [{"name": "python", "description": "Run Python code.", "input_schema": TOOL_SCHEMA}]
R_TOOLS = [{"type": "function", "name": "python", "description": "Run Python code.", "parameters": TOOL_SCHEMA}]
ASK = "What is 6 * 7?"


class Proxy:
    """A started endpoint over a scripted engine, with episodes to open."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.engine = ScriptedChatEngine(tokenizer)
        self.endpoint = ProxyEndpoint("policy", max_tokens=64)
        self.url = ""

    def episode(self) -> tuple[str, EpisodeLink]:
        key = "sk-agentrl-" + secrets.token_urlsafe(12)
        link = EpisodeLink(key, self.tokenizer, Budget(8, 64, 4096, 8, 1.0, 1.0, 0), seed=1)
        self.endpoint.links[key] = link
        return key, link

    def anthropic(self, key: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=self.url.removesuffix("/v1"), api_key=key, max_retries=0)

    def openai(self, key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url, api_key=key, max_retries=0)

    def assert_exact(self, link: EpisodeLink, turns: int) -> None:
        """One segment; each sampled run is an engine sample, after the exact prompt it was given."""
        assert len(link.recorder.segments) == 1 and link.splits == 0
        seg = link.recorder.current
        assert len(seg.turns) == turns == len(self.engine.log)
        for run, (prompt, g) in zip(seg.turns, self.engine.log):
            assert seg.ids[: run.start] == prompt
            assert seg.ids[run.start : run.start + run.n_sampled] == g.token_ids
            assert seg.logprobs[run.start : run.start + run.n_sampled] == g.logprobs
            assert set(seg.mask[run.start : run.start + run.n_sampled]) == {1}
        assert link.delta_prompts == turns - 1  # later prompts: the segment's ids + the render delta


@pytest.fixture
async def proxy(tiny_tokenizer):
    p = Proxy(tiny_tokenizer)
    p.url = await p.endpoint.start(p.engine, tiny_tokenizer)
    yield p
    await p.endpoint.close()


async def _messages_turns(client, stream: bool) -> list:
    msgs = [{"role": "user", "content": ASK}]
    replies = []
    for _ in range(2):
        kw = dict(model="policy", max_tokens=64, system="Be brief.", messages=msgs, tools=A_TOOLS)
        if stream:
            async with client.messages.stream(**kw) as s:
                reply = await s.get_final_message()
        else:
            reply = await client.messages.create(**kw)
        replies.append(reply)
        uses = [b for b in reply.content if b.type == "tool_use"]
        msgs = [*msgs, {"role": "assistant", "content": reply.content}]
        msgs.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "42"} for u in uses]}
        )
    return replies


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_anthropic_conversation_is_one_exact_trajectory(proxy, stream):
    key, link = proxy.episode()
    first, second = await _messages_turns(proxy.anthropic(key), stream)
    assert first.stop_reason == "tool_use" and second.stop_reason == "end_turn"
    assert second.content[0].text == "The answer is 42."
    proxy.assert_exact(link, turns=2)
    assert link.last_text == "The answer is 42."


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_responses_conversation_is_one_exact_trajectory(proxy, stream):
    key, link = proxy.episode()
    client = proxy.openai(key)
    if stream:
        events = [e async for e in await client.responses.create(model="policy", input=ASK, tools=R_TOOLS, stream=True)]
        first = events[-1].response
    else:
        first = await client.responses.create(model="policy", input=ASK, tools=R_TOOLS)
    call = next(i for i in first.output if i.type == "function_call")
    out = [{"type": "function_call_output", "call_id": call.call_id, "output": "42"}]
    second = await client.responses.create(model="policy", previous_response_id=first.id, input=out, tools=R_TOOLS)
    assert second.output_text == "The answer is 42."
    proxy.assert_exact(link, turns=2)
    assert set(link.responses) == {first.id, second.id}  # kept in the episode, gone with it


async def test_a_rewritten_history_starts_a_new_segment(proxy):
    key, link = proxy.episode()
    client = proxy.anthropic(key)
    await client.messages.create(model="policy", max_tokens=64, messages=[{"role": "user", "content": ASK}])
    await client.messages.create(model="policy", max_tokens=64, messages=[{"role": "user", "content": "Forget that."}])
    assert len(link.recorder.segments) == 2 and link.splits == 1


async def test_keys_are_checked_in_each_dialects_shape(proxy):
    key, link = proxy.episode()
    other_key, _ = proxy.episode()
    with pytest.raises(anthropic.AuthenticationError, match="unknown or expired API key") as e:
        await proxy.anthropic("sk-wrong").messages.create(
            model="policy", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError, match="unknown or expired API key") as e:
        await proxy.openai("sk-wrong").responses.create(model="policy", input="hi")
    assert e.value.body["type"] == "authentication_error"
    # a response of one episode is not found from another
    mine = await proxy.openai(key).responses.create(model="policy", input="hi")
    with pytest.raises(openai.BadRequestError, match="not found"):
        await proxy.openai(other_key).responses.create(model="policy", input="again", previous_response_id=mine.id)
    assert len(proxy.engine.log) == 1 and link.recorder.requests == 1


async def test_what_cannot_be_recorded_is_refused_as_in_chat(proxy):
    key, link = proxy.episode()
    msgs = [{"role": "user", "content": ASK}]
    with pytest.raises(anthropic.BadRequestError, match="tool_choice=.*required.*not the policy's own sample"):
        await proxy.anthropic(key).messages.create(
            model="policy", max_tokens=8, messages=msgs, tools=A_TOOLS, tool_choice={"type": "any"}
        )
    with pytest.raises(openai.BadRequestError, match="response_format"):
        await proxy.openai(key).responses.create(model="policy", input=ASK, text={"format": {"type": "json_object"}})
    assert not proxy.engine.log and link.recorder.requests == 0
