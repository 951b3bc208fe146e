"""`agentrl serve` against the clients users point at it: the official `openai` client and `litellm`
(non-streaming and streaming, tools, tool_choice, response_format, unique tool-call ids across
turns) and `agentrl eval --api-base` with no API key in its environment.

Two servers. The real local backend on the tiny model: the protocol, token-by-token streaming,
stop strings cutting a stream short, and what the constrained modes do with a model that never
writes a valid call. And the same HTTP app and request handling over a scripted FakeEngine
(:func:`scripted_server`), whose replies call tools, so the tool paths are exercised
deterministically: there the engine is a script, while the app, the HTTP stack and the clients are
the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading

import pytest

from agentrl.jobs.serve import LocalServer, resolve_target

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

CALL_ID = re.compile(r"call_[0-9a-f]{24}")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code and return its output.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
]
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'


# ------------------------------------------------------------------------------------- servers
@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    with LocalServer(resolve_target(tiny_model_dir), port=0, name="tiny", log=lambda m: None) as server:
        yield server


@contextlib.contextmanager
def scripted_server(tokenizer, reply, name: str = "scripted"):
    """The serve app over a FakeEngine: ``reply(prompt_text, call_index) -> text`` is what the
    "model" writes after the prompt (``<|im_end|>`` is appended). Yields (base url, engine, prompts seen)."""
    from agentrl.engine.fake import FakeEngine
    from agentrl.serving.api import OpenAIAPI
    from agentrl.serving.app import HTTPServer, build_app

    prompts: list[str] = []

    def policy(prompt_ids, params, ctx):
        text = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        prompts.append(text)
        return tokenizer.encode(reply(text, ctx.call_index) + "<|im_end|>", add_special_tokens=False)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    engine = FakeEngine(policy)
    http = HTTPServer(build_app(OpenAIAPI(engine, tokenizer, name)), "127.0.0.1", 0, loop).start()
    try:
        yield f"http://127.0.0.1:{http.port}/v1", engine, prompts
    finally:
        http.stop()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def agent_reply(prompt: str, call_index: int) -> str:
    """Call python until a tool answer is in the prompt, then answer (continues a forced prefix)."""
    if "<tool_response>" in prompt:
        return "The answer is 42."
    if prompt.endswith('"arguments": '):
        return '{"code": "print(6 * 7)"}}\n</tool_call>'
    if prompt.endswith("<tool_call>\n"):
        return CALL[len("<tool_call>\n") :]
    return "Let me compute it.\n" + CALL


def client(url: str, **kw):
    from openai import OpenAI

    return OpenAI(base_url=url, api_key="unused", max_retries=0, **kw)


# ------------------------------------------------------------------------------------- tiny model
def test_chat_streams_token_by_token_and_matches_the_whole_reply(tiny):
    c = client(f"{tiny.url}/v1")
    msgs = [{"role": "user", "content": "Say something"}]
    full = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0)
    chunks = list(
        c.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    with_choices = [ch for ch in chunks if ch.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    pieces = [ch.choices[0].delta.content for ch in with_choices if ch.choices[0].delta.content]
    assert len(pieces) >= 3, f"the reply arrived in {len(pieces)} piece(s), not token by token: {pieces}"
    assert "".join(pieces) == full.choices[0].message.content
    assert with_choices[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert (
        with_choices[-1].choices[0].model_extra["agentrl"]["token_ids"]
        == full.choices[0].model_extra["agentrl"]["token_ids"]
    )
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert len({ch.id for ch in chunks}) == 1
    plain = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=3, stream=True))
    assert all(ch.choices for ch in plain)  # no usage chunk unless asked


def test_first_chunk_arrives_while_the_engine_is_still_sampling(tiny):
    """Real streaming, not a finished reply cut in pieces: when the first text arrives, most of the
    reply has not been sampled yet (the in-process engine's token counter says so)."""
    c = client(f"{tiny.url}/v1")
    before = tiny.engine.stats["generated_tokens"]
    msgs = [{"role": "user", "content": "Talk."}]
    stream = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=200, temperature=0, stream=True)
    at_first = None
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content and at_first is None:
            at_first = tiny.engine.stats["generated_tokens"] - before
    total = tiny.engine.stats["generated_tokens"] - before
    assert at_first is not None and total >= 50, (at_first, total)
    assert at_first < total / 2, f"the first text came after {at_first} of {total} tokens were sampled"


def test_stop_string_cuts_the_stream_and_the_generation(tiny):
    c = client(f"{tiny.url}/v1")
    msgs = [{"role": "user", "content": "Say something"}]
    whole = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=40, temperature=0)
    text = whole.choices[0].message.content
    assert "\n" in text[1:], f"the greedy reply has no newline to stop at: {text!r}"
    stop = text[1:].index("\n") + 1
    chunks = list(
        c.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_tokens=40,
            temperature=0,
            stop=["\n"],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == text[:stop] and "\n" not in streamed
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens < whole.usage.completion_tokens  # sampling stopped there


def test_completions_stream_matches_the_whole_text(tiny):
    c = client(f"{tiny.url}/v1")
    whole = c.completions.create(model="tiny", prompt="The sum of", max_tokens=8, temperature=0)
    chunks = list(c.completions.create(model="tiny", prompt="The sum of", max_tokens=8, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert len([ch for ch in chunks if ch.choices[0].text]) >= 2


def test_tool_choice_modes_on_the_tiny_model(tiny):
    import openai

    c = client(f"{tiny.url}/v1")
    msgs = [{"role": "user", "content": "Compute 6 * 7."}]

    def prompt_len(**kw) -> int:
        r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, tools=TOOLS, **kw)
        return len(r.choices[0].model_extra["agentrl"]["prompt_token_ids"])

    # "none": the tools are not even shown to the model, nothing is parsed
    assert prompt_len(tool_choice="none") < prompt_len(tool_choice="auto") == prompt_len()
    none = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, tools=TOOLS, tool_choice="none")
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")
    # "required" / a named function: a call of the right tool, or a 422 naming tool_choice; never plain text
    for choice, names in (
        ("required", {"python", "bash"}),
        ({"type": "function", "function": {"name": "bash"}}, {"bash"}),
    ):
        try:
            r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, tools=TOOLS, tool_choice=choice)
        except openai.UnprocessableEntityError as e:
            assert e.body["param"] == "tool_choice" and "3 attempt" in e.body["message"]
        else:
            calls = r.choices[0].message.tool_calls
            assert r.choices[0].finish_reason == "tool_calls" and calls and {t.function.name for t in calls} <= names
    # modes that cannot be honoured: 400 naming the field
    bad = [
        ({"tool_choice": {"type": "function", "function": {"name": "ruby"}}}, "tool_choice", "ruby"),
        ({"tool_choice": "sometimes"}, "tool_choice", "sometimes"),
        ({"tool_choice": "required", "tools": None}, "tool_choice", "needs tools"),
        ({"response_format": {"type": "xml"}}, "response_format", "xml"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": 12}}}},
            "response_format",
            "not a valid JSON schema",
        ),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
        ({"functions": [{"name": "f"}]}, "functions", "tools and tool_choice"),
    ]
    for extra, param, words in bad:
        kw = {"tools": TOOLS, **extra}
        if kw["tools"] is None:
            del kw["tools"]
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, **kw)
        assert ei.value.body["param"] == param and words in ei.value.body["message"], (extra, ei.value.body)


# ------------------------------------------------------------------------------------- scripted replies
def test_multi_turn_tool_calls_with_unique_ids(tiny_tokenizer):
    with scripted_server(tiny_tokenizer, agent_reply) as (url, _, prompts):
        c = client(url)
        msgs = [{"role": "user", "content": "What is 6 * 7? Use python."}]
        seen = []
        for _ in range(2):  # two conversations, two turns each
            convo = list(msgs)
            first = c.chat.completions.create(model="scripted", messages=convo, tools=TOOLS)
            choice = first.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me compute it."
            (call,) = choice.message.tool_calls
            assert CALL_ID.fullmatch(call.id) and call.function.name == "python"
            assert json.loads(call.function.arguments) == {"code": "print(6 * 7)"}
            seen.append(call.id)
            convo += [
                choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "42"},
            ]
            second = c.chat.completions.create(model="scripted", messages=convo, tools=TOOLS)
            assert second.choices[0].finish_reason == "stop"
            assert second.choices[0].message.content == "The answer is 42." and not second.choices[0].message.tool_calls
            # the history went back through the model's template: the call and its answer are in the prompt
            assert '"print(6 * 7)"' in prompts[-1] and "<tool_response>\n42\n</tool_response>" in prompts[-1]
        assert len(set(seen)) == len(seen) == 2


def test_streamed_tool_call_accumulates_like_openai(tiny_tokenizer):
    with scripted_server(tiny_tokenizer, agent_reply) as (url, _, _):
        c = client(url)
        msgs = [{"role": "user", "content": "What is 6 * 7?"}]
        chunks = list(c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS, stream=True))
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        calls: dict[int, dict] = {}
        for ch in chunks:
            for tc in ch.choices[0].delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.id or ""
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        assert content.strip() == "Let me compute it." and "<tool_call>" not in content
        assert list(calls) == [0] and calls[0]["name"] == "python" and CALL_ID.fullmatch(calls[0]["id"])
        assert json.loads(calls[0]["arguments"]) == {"code": "print(6 * 7)"}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        # the official client's stream helper rebuilds the same message
        with c.chat.completions.stream(model="scripted", messages=msgs, tools=TOOLS) as stream:
            final = stream.get_final_completion()
        assert final.choices[0].message.tool_calls[0].function.name == "python"


def test_required_and_named_tool_choice_force_the_start_and_resample(tiny_tokenizer):
    import openai

    def reply(prompt, i):  # the first sample of every request is garbage
        return "no call here" if i % 2 == 0 else agent_reply(prompt, i)

    with scripted_server(tiny_tokenizer, reply) as (url, engine, prompts):
        c = client(url)
        msgs = [{"role": "user", "content": "Go."}]
        r = c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS, tool_choice="required")
        assert (
            r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.tool_calls[0].function.name == "python"
        )
        assert engine.calls == 2 and prompts[-1].endswith("<|im_start|>assistant\n<tool_call>\n")
        named = {"type": "function", "function": {"name": "python"}}
        r = c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS, tool_choice=named, stream=True)
        chunks = list(r)
        assert prompts[-1].endswith('<tool_call>\n{"name": "python", "arguments": ')
        assert [ch.choices[0].finish_reason for ch in chunks][-1] == "tool_calls"
        # greedy: the same prompt gives the same reply, so one attempt only, then 422 naming the field
        engine.calls = 0
        with pytest.raises(openai.UnprocessableEntityError) as ei:
            c.chat.completions.create(
                model="scripted", messages=msgs, tools=TOOLS, tool_choice="required", temperature=0
            )
        assert ei.value.body["param"] == "tool_choice" and "1 attempt" in ei.value.body["message"]


def test_parallel_tool_calls_false_and_response_format(tiny_tokenizer):
    import openai

    two = CALL + "\n" + CALL.replace("python", "bash").replace('"code": "print(6 * 7)"', '"command": "ls"')
    with scripted_server(tiny_tokenizer, lambda p, i: two) as (url, _, _):
        c = client(url)
        msgs = [{"role": "user", "content": "Go."}]
        r = c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS)
        assert [t.function.name for t in r.choices[0].message.tool_calls] == ["python", "bash"]
        assert len({t.id for t in r.choices[0].message.tool_calls}) == 2
        with pytest.raises(openai.UnprocessableEntityError) as ei:
            c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS, parallel_tool_calls=False)
        assert ei.value.body["param"] == "parallel_tool_calls"

    with scripted_server(tiny_tokenizer, lambda p, i: ' "a": 1}' if p.endswith("{") else "plain text") as (
        url,
        _,
        prompts,
    ):
        c = client(url)
        msgs = [{"role": "user", "content": "JSON please."}]
        r = c.chat.completions.create(model="scripted", messages=msgs, response_format={"type": "json_object"})
        assert json.loads(r.choices[0].message.content) == {"a": 1} and prompts[-1].endswith("assistant\n{")
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        r = c.chat.completions.create(model="scripted", messages=msgs, response_format=fmt, stream=True)
        assert json.loads("".join(ch.choices[0].delta.content or "" for ch in r)) == {"a": 1}
        fmt["json_schema"]["schema"] = {**schema, "required": ["b"]}
        with pytest.raises(openai.UnprocessableEntityError) as ei:
            c.chat.completions.create(model="scripted", messages=msgs, response_format=fmt)
        assert ei.value.body["param"] == "response_format" and "'b' is a required property" in ei.value.body["message"]


# ------------------------------------------------------------------------------------- litellm
def test_litellm_tools_and_streaming(tiny_tokenizer, tiny):
    """litellm.completion(tools=...) works in agentrl's own environment (its MCP import included),
    without any private keyword, against both servers."""
    import litellm

    with scripted_server(tiny_tokenizer, agent_reply) as (url, _, _):
        msgs = [{"role": "user", "content": "What is 6 * 7?"}]
        r = litellm.completion(model="openai/scripted", api_base=url, api_key="unused", messages=msgs, tools=TOOLS)
        call = r.choices[0].message.tool_calls[0]
        assert (
            call.function.name == "python" and CALL_ID.fullmatch(call.id) and r.choices[0].finish_reason == "tool_calls"
        )
        chunks = list(
            litellm.completion(
                model="openai/scripted", api_base=url, api_key="unused", messages=msgs, tools=TOOLS, stream=True
            )
        )
        rebuilt = litellm.stream_chunk_builder(chunks, messages=msgs)
        assert rebuilt.choices[0].message.tool_calls[0].function.name == "python"
        assert json.loads(rebuilt.choices[0].message.tool_calls[0].function.arguments) == {"code": "print(6 * 7)"}

    base = f"{tiny.url}/v1"
    msgs = [{"role": "user", "content": "hello"}]
    kw = dict(model="openai/tiny", api_base=base, api_key="unused", messages=msgs, max_tokens=6, temperature=0)
    whole = litellm.completion(**kw, tools=TOOLS)
    chunks = list(litellm.completion(**kw, tools=TOOLS, stream=True))
    assert len(chunks) >= 3
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == whole.choices[0].message.content


# ------------------------------------------------------------------------------------- agentrl eval
def _no_keys_env() -> dict:
    from agentrl.common.llm_api import without_secrets

    return without_secrets()


def test_agentrl_eval_against_serve_needs_no_key(tiny, tmp_path):
    env = _no_keys_env()
    assert "OPENAI_API_KEY" not in env
    out = tmp_path / "ep.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "agentrl.cli.main",
        "eval",
        "--env",
        "noop",
        "--env-arg",
        "n_turns=1",
        "--model",
        "openai/tiny",
        "--api-base",
        f"{tiny.url}/v1",
        "-n",
        "3",
        "--max-tokens",
        "4",
        "--retries",
        "0",
        "--out",
        str(out),
        "-q",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(out.with_name("ep.summary.json").read_text())
    # every episode reached the env and back (4-token turns may end cut at the token limit: not an infra failure)
    assert summary["episodes"] == 3 and summary["infra_failures"] == 0, summary
    assert set(summary["outcomes"]) <= {"ok", "truncated_length"} and summary["completion_tokens"] >= 3, summary
    assert "Missing credentials" not in done.stdout + done.stderr


def test_agentrl_eval_without_a_hosted_key_is_one_error_before_any_episode(tmp_path):
    out = tmp_path / "ep.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "agentrl.cli.main",
        "eval",
        "--env",
        "noop",
        "--model",
        "openai/gpt-4o-mini",
        "-n",
        "2",
        "--out",
        str(out),
        "-q",
    ]
    done = subprocess.run(cmd, env=_no_keys_env(), capture_output=True, text=True, timeout=600)
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    assert "OPENAI_API_KEY" in text and "--api-key-env" in text
    assert not out.exists() and not out.with_name("ep.episodes.jsonl").exists()
