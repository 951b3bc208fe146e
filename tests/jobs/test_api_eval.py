"""`agentrl eval`: API-model episodes at text level, through the real litellm client — against a live
SGLang `/v1` endpoint (end to end, loadable chat JSONL) and a scripted endpoint (structured tool calls)."""

import asyncio
import json

import pytest
from scripted_openai import ScriptedOpenAI

import agentrl
from agentrl.common.llm_api import ApiClient, ChatReply
from agentrl.envs.base import AgentEnv, join_messages, new_stats
from agentrl.errors import ConfigError, RegistryError
from agentrl.jobs.eval import (
    ApiEpisode,
    _api_answers,
    _api_assistant,
    output_paths,
    render_action,
    run_eval,
    summarize,
)

KEY_ENV = "AGENTRL_TEST_EVAL_KEY"


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-eval-key-0123456789")


class FlakyEnv(AgentEnv):
    """Odd seeds crash in step (an env bug); even seeds end after one turn with reward 1."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_ = seed
        msgs = [{"role": "user", "content": "Say something."}]
        return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": seed}}

    def step(self, action):
        if self.seed_ % 2:
            raise ValueError("flaky env bug")
        return "", 1.0, True, False, {"messages": [], "tool_stats": new_stats()}


agentrl.register("test/Flaky-v0", entry_point=FlakyEnv, override=True)


# ------------------------------------------------------------------ units: reply <-> env text
def test_render_action_for_each_parser():
    reply = ChatReply("Let me run it.", [{"id": "a", "name": "python", "arguments": '{"code": "print(1)"}'}])
    hermes = render_action(reply, "hermes")
    assert hermes == 'Let me run it.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    assert render_action(reply, "python_block") == "Let me run it.\n```python\nprint(1)\n```"
    assert render_action(ChatReply("just text"), "hermes") == "just text"
    bad = render_action(ChatReply("", [{"id": "a", "name": "python", "arguments": "{not json"}]), "hermes")
    from agentrl.tools.calls import parse_hermes

    parsed = parse_hermes(bad)  # the env answers it as a malformed call, like any model mistake
    assert not parsed.calls and len(parsed.errors) == 1


@pytest.mark.parametrize(
    "arguments", ['{"a": ' + "[" * 5000 + "]" * 5000 + "}", '{"n": ' + "1" * 4301 + "}"], ids=["deep", "huge-int"]
)
def test_render_action_of_hostile_api_arguments_is_a_malformed_call(arguments):
    # json.loads raised RecursionError / ValueError out of the eval (only JSONDecodeError was caught)
    text = render_action(ChatReply("", [{"id": "a", "name": "python\ud83d", "arguments": arguments}]), "hermes")
    from agentrl.tools.calls import parse_hermes

    parsed = parse_hermes(text)
    assert not parsed.calls and [e.kind for e in parsed.errors] == ["malformed"]


def test_conversation_back_to_the_api_is_openai_shaped():
    reply = ChatReply("", [{"id": "tc-1", "name": "python", "arguments": '{"code": "1"}'}])
    msg, declared = _api_assistant(reply, render_action(reply, "hermes"), "hermes")
    assert msg["tool_calls"][0]["id"] == "tc-1" and declared == ["tc-1"]
    answers = _api_answers(
        [{"role": "tool", "name": "python", "content": "1", "tool_call_id": "call_0"}], declared, True
    )
    assert answers == [{"role": "tool", "tool_call_id": "tc-1", "content": "1"}]
    # text-mode reply: calls parsed with the env's parser; an answer to a malformed call goes as a user message
    text = '<tool_call>{"name": "python", "arguments": {"code": "2"}}</tool_call><tool_call>{oops</tool_call>'
    msg, declared = _api_assistant(ChatReply(text), text, "hermes")
    assert declared == ["call_0"] and msg["tool_calls"][0]["function"]["name"] == "python"
    answers = _api_answers(
        [
            {"role": "tool", "content": "2", "tool_call_id": "call_0"},
            {"role": "tool", "content": "Error: bad", "tool_call_id": "call_1"},
        ],
        declared,
        False,
    )
    assert [a["role"] for a in answers] == ["tool", "user"]


def test_summary_env_kwargs_hide_endpoint_credentials():
    from agentrl.jobs.eval import _public

    kw = {"env": "noop", "judge": {"model": "openai/j", "api_base": "https://u:secret@h/v1?key=k"}}
    assert _public(kw) == {"env": "noop", "judge": {"model": "openai/j", "api_base": "https://h/v1"}}


def test_output_paths():
    chat, eps, summ = output_paths("/x/base.jsonl")
    assert (str(chat), str(eps), str(summ)) == ("/x/base.jsonl", "/x/base.episodes.jsonl", "/x/base.summary.json")


def test_bad_arguments_fail_before_any_call(tmp_path):
    client = ApiClient("openai/m", api_base="http://127.0.0.1:9/v1")
    with pytest.raises(RegistryError, match="unknown env id"):
        asyncio.run(run_eval("no_such_env", client, n=1, out=tmp_path / "x.jsonl"))
    with pytest.raises(ConfigError, match="n_turnz"):
        asyncio.run(run_eval("noop", client, n=1, env_kwargs={"n_turnz": 1}))
    with pytest.raises(ConfigError, match="n \\(episodes\\)"):
        asyncio.run(run_eval("noop", client, n=0))


# ------------------------------------------------------------------ scripted endpoint: structured tool calls
def test_structured_tool_calls_run_in_the_env_and_the_answers_go_back(tmp_path, key):
    """Turn 1: a structured python call (really run in the sandbox); turn 2: the final answer.
    The second request carries the tool answer tied to the call's id; the reward is the env's."""
    script = [
        {"content": "", "tool_calls": [("python", {"code": "print(6 * 7)"})]},
        {"content": "The answer is \\boxed{42}."},
    ]
    with ScriptedOpenAI(script) as srv:
        client = ApiClient("openai/scripted", api_base=srv.url, api_key_env=KEY_ENV, max_retries=0)
        task = {"id": "t42", "prompt": "What is 6*7?", "answer": "42"}

        async def go():
            from agentrl.jobs.eval import run_api_episode

            return await run_api_episode(client, lambda: agentrl.make("code_exec"), 0, 0, options={"task": task})

        ep = asyncio.run(go())
    assert ep.outcome == "ok" and ep.reward == 1.0 and ep.tool_calls == 1 and ep.turns == 2, ep.detail
    second = srv.requests[1]["body"]["messages"]
    assert second[-2]["tool_calls"][0]["id"] == "tc-0-0"
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "tc-0-0" and "42" in second[-1]["content"]
    assert srv.requests[0]["body"]["tools"][0]["function"]["name"] == "python"
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert "<tool_call>" in ep.messages[2]["content"]


def test_failures_are_recorded_per_episode_and_never_break_the_batch(tmp_path, key):
    """Odd episodes crash in the env (env_error), even ones finish ok; then a dead endpoint makes every
    episode engine_error. Every episode is in the episodes file; only ok ones are chat rows."""
    out = tmp_path / "flaky.jsonl"
    with ScriptedOpenAI([{"content": "hello"}]) as srv:
        client = ApiClient("openai/scripted", api_base=srv.url, api_key_env=KEY_ENV, max_retries=0)
        summary = asyncio.run(run_eval("test/Flaky-v0", client, n=6, concurrency=3, out=out))
    eps = [json.loads(line) for line in out.with_name("flaky.episodes.jsonl").read_text().splitlines()]
    by_outcome = {}
    for e in eps:
        by_outcome.setdefault(e["outcome"], []).append(e["task_seed"] % 2)
    assert sorted(by_outcome) == ["env_error", "ok"] and set(by_outcome["env_error"]) == {1}
    assert summary["outcomes"]["ok"] + summary["outcomes"]["env_error"] == 6 == len(eps)
    assert len(out.read_text().splitlines()) == summary["outcomes"]["ok"] == summary["chat_rows"]
    assert "flaky env bug" in next(e["detail"] for e in eps if e["outcome"] == "env_error")

    dead = ApiClient(
        "openai/scripted", api_base="http://127.0.0.1:9/v1", api_key_env=KEY_ENV, max_retries=1, backoff_s=0.01
    )
    summary = asyncio.run(run_eval("noop", dead, n=3, out=tmp_path / "dead.jsonl"))
    assert summary["outcomes"] == {"engine_error": 3} and summary["infra_failures"] == 3
    assert (tmp_path / "dead.jsonl").read_text() == ""


# ------------------------------------------------------------------ live SGLang endpoint
def _sglang_model(server):
    return f"openai/{server.model_path}"


@pytest.mark.sglang
def test_eval_noop_end_to_end_writes_loadable_chat_jsonl(sglang_server, sglang_model_dir, tmp_path, key):
    """N episodes through litellm against SGLang's /v1; the chat JSONL loads with `agentrl sft`'s loader."""
    from transformers import AutoTokenizer

    from agentrl.warmstart.chat_data import load_chat_jsonl

    out = tmp_path / "noop.jsonl"
    # a stop string makes the tiny model's garbage end with finish_reason "stop" (an ok turn)
    client = ApiClient(
        _sglang_model(sglang_server),
        api_base=sglang_server.url + "/v1",
        api_key_env=KEY_ENV,
        sampling={"max_tokens": 8, "stop": ["e", "a", "o"]},
        timeout_s=120,
    )
    summary = asyncio.run(run_eval("noop", client, n=4, env_kwargs={"n_turns": 2}, concurrency=4, out=out))
    assert summary["episodes"] == 4 and sum(summary["outcomes"].values()) == 4
    assert summary["outcomes"].get("ok", 0) >= 1, summary["outcomes"]
    assert summary["completion_tokens"] > 0 and summary["prompt_tokens"] > 0
    examples = load_chat_jsonl(out, AutoTokenizer.from_pretrained(str(sglang_model_dir)))
    assert len(examples) == summary["chat_rows"] == summary["outcomes"]["ok"]
    assert all(ex.num_target > 0 for ex in examples)
    saved = json.loads(out.with_name("noop.summary.json").read_text())
    assert saved["model"] == _sglang_model(sglang_server) and saved["episodes"] == 4


@pytest.mark.sglang
def test_eval_command_on_code_exec(sglang_server, tmp_path, key):
    """`agentrl eval` itself: code_exec (tool schemas sent, text-mode replies parsed by the env)."""
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    out = tmp_path / "ce.jsonl"
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--env",
            "code_exec",
            "--model",
            _sglang_model(sglang_server),
            "--api-base",
            sglang_server.url + "/v1",
            "--api-key-env",
            KEY_ENV,
            "-n",
            "2",
            "--max-tokens",
            "8",
            "--max-turns",
            "2",
            "--out",
            str(out),
            "-q",
            "--sampling",
            "stop=[e]",
            "--env-arg",
            "split=eval",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "solve_rate" in res.output and "agentrl eval" in res.output
    eps = [json.loads(line) for line in out.with_name("ce.episodes.jsonl").read_text().splitlines()]
    assert len(eps) == 2 and all(e["outcome"] in ("ok", "truncated_length", "truncated_turns") for e in eps), eps
    assert all(e["task"]["id"].startswith("d3-eval") for e in eps)


def test_eval_command_reports_a_bad_model_clearly(tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    res = CliRunner().invoke(
        app, ["eval", "--env", "noop", "--model", "gpt-without-provider", "--out", str(tmp_path / "x.jsonl")]
    )
    assert res.exit_code == 2 and "provider/name" in res.output


def test_summary_solve_rate_counts_every_episode():
    """An infrastructure failure is an unsolved task (it used to leave the denominator: 2/3 here)."""
    eps = [
        ApiEpisode(0, 0, reward=1.0, tool_calls=1),
        ApiEpisode(1, 1, reward=1.0),
        ApiEpisode(2, 2, outcome="truncated_turns"),
        ApiEpisode(3, 3, outcome="deadline"),
    ]
    s = summarize(eps)
    assert (s["episodes"], s["solve_rate"], s["infra_failures"], s["infra_failure_rate"]) == (4, 0.5, 1, 0.25)
    assert s["reward_mean"] == 2 / 3 and s["tool_use_rate"] == 1 / 3  # over the trainable episodes


# ------------------------------------------------------------------ credentials and retries
@pytest.fixture
def no_keys(monkeypatch):
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", KEY_ENV):
        monkeypatch.delenv(name, raising=False)


def test_credential_plan(no_keys, monkeypatch):
    from agentrl.common.llm_api import credential_plan

    assert credential_plan("openai/tiny", "http://127.0.0.1:8000/v1", None) == "placeholder"
    assert credential_plan("openai/tiny", "http://localhost:8000/v1", None) == "placeholder"
    assert credential_plan("openai/m", "http://gpu-box:8000/v1", None) == "placeholder"  # OpenAI-compatible, no key set
    with pytest.raises(ConfigError, match=r"'openai/gpt-4o-mini' needs an API key: set OPENAI_API_KEY.*api-key-env"):
        credential_plan("openai/gpt-4o-mini", None, None)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        credential_plan("anthropic/claude-3-5-haiku-latest", None, None)
    with pytest.raises(ConfigError, match=f"api_key_env='{KEY_ENV}' names an environment variable that is not set"):
        credential_plan("openai/m", "http://127.0.0.1:1/v1", KEY_ENV)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-hosted-0123456789")
    assert credential_plan("openai/gpt-4o-mini", None, None) == "provider"
    assert credential_plan("openai/tiny", "http://127.0.0.1:8000/v1", None) == "placeholder"  # never the real key
    monkeypatch.setenv(KEY_ENV, "sk-named-0123456789")
    assert credential_plan("openai/m", "http://127.0.0.1:1/v1", KEY_ENV) == "env"


def test_local_endpoint_gets_a_placeholder_key_never_the_real_one(no_keys, monkeypatch):
    with ScriptedOpenAI([{"content": "hi"}]) as srv:
        client = ApiClient("openai/scripted", api_base=srv.url, max_retries=0)
        assert asyncio.run(client.chat([{"role": "user", "content": "x"}])).content == "hi"
        monkeypatch.setenv("OPENAI_API_KEY", "sk-hosted-0123456789")
        asyncio.run(client.chat([{"role": "user", "content": "x"}]))
    assert [r["authorization"] for r in srv.requests] == ["Bearer agentrl-no-key"] * 2


def test_missing_hosted_key_fails_at_once_without_retries(no_keys):
    client = ApiClient("openai/gpt-4o-mini", max_retries=3, backoff_s=10.0)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        client.check_credentials()
    from agentrl.errors import EngineError

    with pytest.raises(EngineError, match="needs an API key"):
        asyncio.run(asyncio.wait_for(client.chat([{"role": "user", "content": "x"}]), 5))


def test_only_transient_errors_are_retried(key):
    import litellm

    from agentrl.common.llm_api import is_transient

    ex = litellm.exceptions
    kw = {"llm_provider": "openai", "model": "m"}
    assert is_transient(ex.RateLimitError("slow down", **kw)) and is_transient(ex.ServiceUnavailableError("busy", **kw))
    assert is_transient(ex.APIConnectionError("reset by peer", **kw)) and is_transient(TimeoutError())
    assert not is_transient(ex.AuthenticationError("bad key", **kw))
    assert not is_transient(ex.BadRequestError("bad", **kw))
    assert not is_transient(ex.ContextWindowExceededError("too long", **kw))
    assert not is_transient(
        ex.InternalServerError("OpenAIException - Missing credentials. Please pass an `api_key`", **kw)
    )
    with ScriptedOpenAI([401, {"content": "never reached"}]) as srv:
        client = ApiClient("openai/scripted", api_base=srv.url, api_key_env=KEY_ENV, max_retries=3, backoff_s=0.01)
        from agentrl.errors import EngineError

        with pytest.raises(EngineError, match=r"after 1 attempt\(s\) \(not a transient error: not retried\)"):
            asyncio.run(client.chat([{"role": "user", "content": "x"}]))
    assert len(srv.requests) == 1


# ------------------------------------------------------------------ attempts: pass@k, and an eval that measured nothing
class SayYesEnv(AgentEnv):
    """One turn: reward 1 when the reply says yes."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        msgs = [{"role": "user", "content": "Say yes."}]
        return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": seed}}

    def step(self, action):
        return "", float("yes" in action), True, False, {"messages": [], "tool_stats": new_stats()}


agentrl.register("test/SayYes-v0", entry_point=SayYesEnv, override=True)


def test_eval_command_attempts_report_pass_at_k(tmp_path):
    """3 tasks x 3 attempts, one at a time, attempt-major (t0 t1 t2, t0 t1 t2, t0 t1 t2). Solved:
    t0 none (one of its attempts a 400: engine_error, an unsolved attempt), t1 once, t2 every time.
      pass@1 = (0 + 1/3 + 1) / 3 = 4/9 = 0.444
      pass@2 = (0 + (1 - C(2,2)/C(3,2)) + 1) / 3 = (0 + 2/3 + 1) / 3 = 5/9 = 0.556
      pass@3 = (0 + 1 + 1) / 3 = 2/3 = 0.667
      avg@3 = 4 solved / 9 attempts = 0.444, infra_failures 1 of 9"""
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    no, yes = {"content": "no"}, {"content": "yes"}
    script = [no, no, yes, 400, yes, yes, no, no, yes]
    out = tmp_path / "yes.jsonl"
    with ScriptedOpenAI(script, repeat_last=False) as srv:
        res = CliRunner().invoke(
            app,
            ["eval", "--env", "test/SayYes-v0", "--model", "openai/scripted", "--api-base", srv.url]
            + ["-n", "3", "--attempts", "3", "--concurrency", "1", "--retries", "0", "--out", str(out), "-q"],
        )
    assert res.exit_code == 0, res.output
    assert len(srv.requests) == 9
    s = json.loads(out.with_name("yes.summary.json").read_text())
    assert (s["tasks"], s["attempts"], s["episodes"], s["infra_failures"]) == (3, 3, 9, 1)
    assert [s["pass@1"], s["pass@2"], s["pass@3"], s["avg@3"]] == pytest.approx([4 / 9, 5 / 9, 2 / 3, 4 / 9])
    assert s["solve_rate"] == pytest.approx(4 / 9) and s["infra_failure_rate"] == pytest.approx(1 / 9)
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in res.output.splitlines() if "│" in line}
    assert (rows["pass@1"], rows["pass@2"], rows["pass@3"], rows["avg@3"]) == ("0.444", "0.556", "0.667", "0.444")
    assert rows["tasks x attempts"] == "3 x 3" and rows["infra_failures"] == "1" and rows["episodes"] == "9"
    eps = [json.loads(line) for line in out.with_name("yes.episodes.jsonl").read_text().splitlines()]
    assert sorted((e["index"], e["attempt"]) for e in eps) == [(i, a) for i in range(3) for a in range(3)]
    assert {(e["index"], e["attempt"]) for e in eps if e["outcome"] == "engine_error"} == {(0, 1)}
    assert len({e["task_seed"] for e in eps if e["index"] == 1}) == 1  # every attempt of a task is the same task


def test_eval_command_one_attempt_adds_no_pass_at_k(tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    out = tmp_path / "one.jsonl"
    with ScriptedOpenAI([{"content": "yes"}]) as srv:
        res = CliRunner().invoke(
            app,
            ["eval", "--env", "test/SayYes-v0", "--model", "openai/scripted", "--api-base", srv.url]
            + ["-n", "2", "--out", str(out), "-q"],
        )
    assert res.exit_code == 0, res.output
    s = json.loads(out.with_name("one.summary.json").read_text())
    assert s["episodes"] == 2 and s["solve_rate"] == 1.0 and not any(k.startswith(("pass@", "avg@")) for k in s)
    assert "pass@" not in res.output and "attempts" not in s


def test_eval_command_exits_non_zero_when_every_episode_failed(tmp_path):
    """The endpoint is down: every episode ends engine_error. That is no result: one error line naming
    the outcome and the first episode's detail, a non-zero exit; the files are still written."""
    from refused_port import refused_port
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    out = tmp_path / "down.jsonl"
    with refused_port() as port:
        res = CliRunner().invoke(
            app,
            ["eval", "--env", "noop", "--model", "openai/m", "--api-base", f"http://127.0.0.1:{port}/v1"]
            + ["-n", "2", "--set", "eval.attempts=2", "--retries", "0", "--out", str(out), "-q"],
        )
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.output
    assert "every one of the 4 episodes ended engine_error" in errors[0] and "nothing was measured" in errors[0]
    eps = [json.loads(line) for line in out.with_name("down.episodes.jsonl").read_text().splitlines()]
    assert len(eps) == 4 and eps[0]["detail"] and " ".join(eps[0]["detail"].split())[:60] in errors[0]
    assert "solve_rate" not in res.output  # no table that a script could take for a result
