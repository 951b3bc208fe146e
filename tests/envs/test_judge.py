"""LLM-judge reward: score parsing, rubric checks, the API client's retries/limits, and the judge
through the real litellm client against a live SGLang `/v1` endpoint (garbage -> RewardError, never 0)."""

import asyncio

import pytest
from scripted_openai import ScriptedOpenAI

from agentrl.common.llm_api import ApiClient, public_url, redact
from agentrl.envs.judge import DEFAULT_RUBRIC, JudgeReward, parse_score, render_transcript
from agentrl.envs.judged import JudgedEnv
from agentrl.errors import ConfigError, RewardError

KEY_ENV = "AGENTRL_TEST_JUDGE_KEY"


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-judge-key-0123456789")
    return "sk-test-judge-key-0123456789"


# ------------------------------------------------------------------ parse_score
@pytest.mark.parametrize(
    "text, want",
    [
        ("The answer is right.\nSCORE: 7", 7.0),
        ("**Score:** 8.5", 8.5),
        ('{"reason": "ok", "score": 3}', 3.0),
        ("score = 4/5", 8.0),  # a fraction of the range
        ("9", 9.0),
        ("SCORE: 2\nOn reflection...\nSCORE: 6", 6.0),  # the last one wins
        ("<think>SCORE: 1 maybe</think>Final. SCORE: 10", 10.0),
        ("Score: 0", 0.0),
    ],
)
def test_parse_score_formats(text, want):
    assert parse_score(text, 0, 10) == pytest.approx(want)


@pytest.mark.parametrize(
    "text, match",
    [
        ("This answer looks great!", "no score"),
        ("", "no score"),
        ("<think>SCORE: 5</think>", "no score"),  # only inside the reasoning
        ("SCORE: 11", r"outside \[0, 10\]"),
        ("SCORE: -1", "outside"),
        ("score: 3/0", "non-positive denominator"),
    ],
)
def test_parse_score_errors_are_reward_errors(text, match):
    with pytest.raises(RewardError, match=match):
        parse_score(text, 0, 10)


# ------------------------------------------------------------------ rubric and prompt
def test_rubric_is_checked():
    with pytest.raises(ConfigError, match="unknown field"):
        JudgeReward("openai/judge", "{answer} {nope}")
    with pytest.raises(ConfigError, match="no {answer}"):
        JudgeReward("openai/judge", "Grade {question}")
    with pytest.raises(ConfigError, match="min_score < max_score"):
        JudgeReward("openai/judge", min_score=5, max_score=5)
    with pytest.raises(ConfigError, match="not a valid template"):
        JudgeReward("openai/judge", "{answer} {")
    with pytest.raises(ConfigError, match="provider/name"):
        JudgeReward("gpt-judge")
    with pytest.raises(ConfigError, match="with at least 'model'"):
        JudgeReward.from_config({"rubric": "{answer}"})
    with pytest.raises(ConfigError, match="unexpected keyword"):
        JudgeReward.from_config({"model": "openai/j", "temprature": 0})


def test_prompt_holds_task_reference_answer_and_transcript():
    judge = JudgeReward("openai/judge", max_transcript_chars=200)
    transcript = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "What is 6*7?"},
        {
            "role": "assistant",
            "content": "let me run it",
            "tool_calls": [{"name": "python", "arguments": {"code": "print(6*7)"}}],
        },
        {"role": "tool", "name": "python", "content": "42"},
        {"role": "assistant", "content": "\\boxed{42}"},
    ]
    p = judge.prompt({"id": 1, "prompt": "What is 6*7?", "answer": 42}, "\\boxed{42}", transcript)
    assert "What is 6*7?" in p and "42" in p and "\\boxed{42}" in p and "[python result] 42" in p
    assert "print(6*7)" in p and "SCORE: <number from 0 to 10>" in p
    long = render_transcript([{"role": "tool", "content": "x" * 1000}, {"role": "assistant", "content": "end"}], 200)
    assert len(long) < 260 and "chars cut" in long
    assert "{answer}" in DEFAULT_RUBRIC


# ------------------------------------------------------------------ the API client
def test_client_config_errors():
    with pytest.raises(ConfigError, match="provider"):
        ApiClient("nonexistent-provider-xyz/model-1")
    with pytest.raises(ConfigError, match="api_key_env"):
        ApiClient("openai/m", api_key_env="not a name")
    with pytest.raises(ConfigError, match="may not set"):
        ApiClient("openai/m", sampling={"api_key": "x"})
    with pytest.raises(ConfigError, match="concurrency"):
        ApiClient("openai/m", concurrency=0)


def test_redact_and_public_url(monkeypatch):
    monkeypatch.setenv("SOME_PROVIDER_API_KEY", "sk-very-secret-value-123")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_456789")
    monkeypatch.setenv("ORDINARY_PATH_VAR", "/usr/local/something")
    text = "key sk-very-secret-value-123 and hf_secret_token_456789 at /usr/local/something"
    assert redact(text) == "key [redacted] and [redacted] at /usr/local/something"
    assert public_url("https://user:pw@host:8080/v1?key=abc") == "https://host:8080/v1"
    client = ApiClient("openai/m", api_base="https://user:pw@host/v1")
    assert "pw" not in repr(client) and "pw" not in str(client.describe())


async def test_concurrency_limit_is_shared_per_model_and_endpoint():
    a = ApiClient("openai/m", api_base="http://h/v1", concurrency=3)
    b = ApiClient("openai/m", api_base="http://h/v1", concurrency=3)
    c = ApiClient("openai/m", api_base="http://other/v1", concurrency=3)
    assert a._limit() is b._limit() and a._limit() is not c._limit()


def test_concurrency_limit_holds_across_judges(key):
    """Eight verdicts from four judges of one model/endpoint with concurrency=2: the endpoint never
    holds more than 2 requests at once."""
    with ScriptedOpenAI([{"content": "SCORE: 5", "delay_s": 0.2}]) as srv:
        judges = [JudgeReward("openai/judge", api_base=srv.url, api_key_env=KEY_ENV, concurrency=2) for _ in range(4)]

        async def go():
            return await asyncio.gather(*(judges[i % 4]({"id": i}, "a", []) for i in range(8)))

        scores = asyncio.run(go())
    assert scores == [0.5] * 8 and len(srv.requests) == 8
    assert 1 <= srv.max_inflight <= 2, srv.max_inflight


def test_retries_transient_status_then_parses_the_score(key):
    """Two 503s then a verdict: litellm (really) calls the endpoint 3 times; the key comes from the
    named variable and reaches only the endpoint; the score is rescaled to [0, 1]."""
    with ScriptedOpenAI([503, 503, {"content": "Correct.\nSCORE: 7"}]) as srv:
        judge = JudgeReward("openai/judge", api_base=srv.url, api_key_env=KEY_ENV, max_retries=3, backoff_s=0.01)
        score = asyncio.run(judge({"id": 1, "prompt": "q", "answer": "a"}, "a", []))
    assert score == pytest.approx(0.7)
    assert len(srv.requests) == 3
    assert srv.requests[-1]["authorization"] == f"Bearer {key}"
    assert srv.requests[-1]["body"]["temperature"] == 0.0


def test_non_transient_error_is_not_retried_and_is_a_reward_error(key):
    with ScriptedOpenAI([400]) as srv:
        judge = JudgeReward("openai/judge", api_base=srv.url, api_key_env=KEY_ENV, max_retries=3, backoff_s=0.01)
        with pytest.raises(RewardError, match="judge call failed.*after 1 attempt") as ei:
            asyncio.run(judge({"id": 1}, "a", []))
    assert len(srv.requests) == 1 and key not in str(ei.value)


def test_retries_run_out_into_a_reward_error(key):
    with ScriptedOpenAI([500]) as srv:
        judge = JudgeReward("openai/judge", api_base=srv.url, api_key_env=KEY_ENV, max_retries=2, backoff_s=0.01)
        with pytest.raises(RewardError, match="after 3 attempt"):
            asyncio.run(judge({"id": 1}, "a", []))
    assert len(srv.requests) == 3


def test_timeout_is_a_reward_error(key):
    import socket

    with socket.socket() as s:  # accepts connections, never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        judge = JudgeReward(
            "openai/judge",
            api_base=f"http://127.0.0.1:{s.getsockname()[1]}/v1",
            api_key_env=KEY_ENV,
            timeout_s=0.5,
            max_retries=0,
        )
        with pytest.raises(RewardError, match="judge call failed"):
            asyncio.run(judge({"id": 1}, "a", []))


# ------------------------------------------------------------------ JudgedEnv (fake judge: tests the wrapper)
class FixedScoreJudge(JudgeReward):
    """Fake judge for testing the wrapper only: a fixed score, no API."""

    def __init__(self, score):
        self.score, self.calls = score, []

    async def __call__(self, task, final_text, transcript):
        self.calls.append((task, final_text, transcript))
        if isinstance(self.score, Exception):
            raise self.score
        return self.score


@pytest.mark.parametrize("combine, want", [("replace", 0.5), ("add", 1.5), ("multiply", 0.5)])
def test_judged_env_combines_env_reward_and_judge_score(combine, want):
    from agentrl.envs.noop import NoopEnv

    judge = FixedScoreJudge(0.25)
    env = JudgedEnv(
        NoopEnv(n_turns=2, reward=1.0), judge, combine=combine, weight=2.0 if combine != "multiply" else 1.0
    )
    _, info = env.reset(seed=3)
    assert env.step("first")[2] is False and not judge.calls  # not final: not judged
    _, reward, term, _, info = env.step("final answer")
    assert term and reward == pytest.approx(want if combine != "multiply" else 0.25)
    task, final, transcript = judge.calls[0]
    assert final == "final answer" and task == info.get("task", task)
    assert [m["role"] for m in transcript] == ["user", "assistant", "user", "assistant"]
    assert env.n_turns == 2  # attributes of the wrapped env pass through
    env.close()


def test_judged_env_failure_raises_reward_error_and_checks_combine():
    from agentrl.envs.noop import NoopEnv

    with pytest.raises(ConfigError, match="combine"):
        JudgedEnv(NoopEnv(), FixedScoreJudge(1.0), combine="max")
    env = JudgedEnv(NoopEnv(n_turns=1), FixedScoreJudge(RewardError("judge down")))
    env.reset(seed=0)
    with pytest.raises(RewardError, match="judge down"):
        env.step("answer")
    env.close()


def test_judged_env_registered_and_validated():
    import agentrl

    with pytest.raises(ConfigError, match="needs a judge"):
        agentrl.make("judged", env="noop")
    env = agentrl.make(
        "judged", env="noop", judge={"model": "openai/j", "api_base": "http://127.0.0.1:9/v1"}, n_turns=3
    )
    assert isinstance(env, JudgedEnv) and env.n_turns == 3
    env.close()


# ------------------------------------------------------------------ against a live SGLang endpoint
@pytest.mark.sglang
def test_judge_on_live_endpoint_turns_garbage_into_reward_error(sglang_server, key):
    """The tiny model's reply is no verdict: the judge raises RewardError quoting it (never 0)."""
    judge = JudgeReward(
        f"openai/{sglang_server.model_path}",
        api_base=sglang_server.url + "/v1",
        api_key_env=KEY_ENV,
        max_tokens=12,
        max_retries=1,
        timeout_s=120,
    )
    with pytest.raises(RewardError, match="no score|outside") as ei:
        asyncio.run(judge({"id": 1, "prompt": "What is 2+2?", "answer": "4"}, "\\boxed{4}", []))
    assert key not in str(ei.value)


@pytest.mark.sglang
def test_judged_episode_ends_as_reward_error_in_the_episode_manager(sglang_server, key, tiny_tokenizer):
    """A judged env in the RL episode loop: the judge's failure is outcome reward_error (not trainable)."""
    from agentrl.config.schema import RolloutConfig
    from agentrl.engine.fake import FakeEngine
    from agentrl.envs.noop import NoopEnv
    from agentrl.episodes.manager import EpisodeManager, EpisodeSpec
    from agentrl.trajectory import Outcome

    eos = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = FakeEngine(lambda ids, params, ctx: [tiny_tokenizer.encode("hi")[0], eos])
    judge = {
        "model": f"openai/{sglang_server.model_path}",
        "api_base": sglang_server.url + "/v1",
        "api_key_env": KEY_ENV,
        "max_tokens": 12,
        "max_retries": 0,
        "timeout_s": 120,
    }
    mgr = EpisodeManager(
        engine,
        lambda: JudgedEnv(NoopEnv(n_turns=1), judge),
        tiny_tokenizer,
        RolloutConfig(max_new_tokens=8, max_turns=2),
    )
    traj = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, 1, 1)))
    assert traj.outcome == Outcome.REWARD_ERROR and not traj.trainable, traj.outcome_detail
    assert "judge" in traj.outcome_detail and key not in traj.outcome_detail


def test_judged_env_in_agentrl_run(tiny_model_dir, tmp_path, key):
    """`agentrl run` on a judged env (the judge a scripted endpoint saying 7/10): every episode's
    reward is the judge's 0.7, and the run trains and writes its metrics."""
    import json

    from short_run import short_run_cfg as _cfg

    from agentrl.jobs.run import Runner

    with ScriptedOpenAI([{"content": "Fine.\nSCORE: 7"}]) as srv:
        judge = {"model": "openai/judge", "api_base": srv.url, "api_key_env": KEY_ENV}
        cfg = _cfg(
            tiny_model_dir,
            tmp_path / "run",
            1,
            [
                "env.id=judged",
                f"env.kwargs={json.dumps({'env': 'test/Short-v0', 'judge': judge})}",
                "eval.num_tasks=0",
                "train.groups_per_step=2",
                "logging.tensorboard=false",
            ],
        )
        summary = asyncio.run(Runner(cfg, progress=False).run())
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["rollout/reward_mean"] for r in rows if "rollout/reward_mean" in r]
    assert summary["steps"] == 1 and rewards and all(r == pytest.approx(0.7) for r in rewards), rows
    assert len(srv.requests) >= 16  # every episode of the step was judged
