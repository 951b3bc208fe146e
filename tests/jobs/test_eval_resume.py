"""Resuming an interrupted `agentrl eval` (agentrl.jobs.eval_store): only missing and infrastructure-failed
attempts run again, every (task, attempt) is counted once, and the numbers equal an uninterrupted run's."""

import asyncio
import json

import pytest
from scripted_openai import ScriptedOpenAI

import agentrl
from agentrl.envs.base import AgentEnv, join_messages, new_stats
from agentrl.errors import ConfigError, EngineError
from agentrl.jobs.eval import run_eval
from agentrl.jobs.eval_store import jsonl_rows


class EchoEnv(AgentEnv):
    """One turn on a task named by its seed: reward 1 when the reply says yes."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        msgs = [{"role": "user", "content": f"Task {seed}: say yes or no."}]
        return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": seed}}

    def step(self, action):
        return "", float(action == "yes"), True, False, {"messages": [], "tool_stats": new_stats()}


agentrl.register("test/Echo-v0", entry_point=EchoEnv, override=True)


class FakeClient:
    """A deterministic stand-in for ApiClient: the answer depends on the prompt only (seed // 7 even:
    yes). ``die_after``: the call that number raises KeyboardInterrupt (a Ctrl-C mid-eval);
    ``fail``: calls (by number) that fail as the endpoint does when down."""

    model = "fake/echo"

    def __init__(self, die_after=None, fail=()):
        self.calls, self.die_after, self.fail = 0, die_after, set(fail)

    def describe(self):
        return {"model": self.model, "api_base": None, "sampling": {"max_tokens": 8}}

    async def chat(self, messages, tools=None):
        from agentrl.common.llm_api import ChatReply

        self.calls += 1
        if self.calls == self.die_after:
            raise KeyboardInterrupt
        if self.calls in self.fail:
            raise EngineError("endpoint down")
        seed = int(messages[-1]["content"].split()[1].rstrip(":"))
        return ChatReply("yes" if (seed // 7) % 2 == 0 else "no", [], "stop")


def _eval(client, out, **kw):
    args = dict(n=6, attempts=3, concurrency=2, seed=3, out=out)
    return asyncio.run(run_eval("test/Echo-v0", client, **{**args, **kw}))


def _pairs(out):
    return [(r["index"], r["attempt"]) for _, r in jsonl_rows(out.with_name(out.stem + ".episodes.jsonl"))]


RATES = ("episodes", "solve_rate", "infra_failures", "pass@1", "pass@2", "pass@3", "avg@3", "tasks", "chat_rows")


def test_interrupted_eval_resumes_to_the_uninterrupted_numbers(tmp_path):
    whole = _eval(FakeClient(), tmp_path / "whole.jsonl")
    out = tmp_path / "cut.jsonl"
    with pytest.raises(KeyboardInterrupt):
        _eval(FakeClient(die_after=9, fail={2, 5}), out)
    before = _pairs(out)
    assert 0 < len(before) < 18  # what finished before the interrupt is on disk
    failed = [r for _, r in jsonl_rows(tmp_path / "cut.episodes.jsonl") if r["outcome"] != "ok"]
    assert [r["outcome"] for r in failed] == ["engine_error", "engine_error"]

    said, client = [], FakeClient()
    resumed = _eval(client, out, resume=True, say=said.append)
    finished_ok = len(before) - len(failed)
    assert client.calls == 18 - finished_ok  # only the missing and the infra-failed attempts ran
    assert said == [
        f"resuming {tmp_path / 'cut.episodes.jsonl'}: {finished_ok} of 18 attempts finished, {18 - finished_ok} to run"
    ]
    assert sorted(_pairs(out)) == [(i, a) for i in range(6) for a in range(3)]  # each exactly once
    assert {k: resumed[k] for k in RATES} == {k: whole[k] for k in RATES}
    assert resumed["resumed"] == finished_ok and resumed["infra_failures"] == 0
    assert len(out.read_text().splitlines()) == whole["chat_rows"]

    again = FakeClient()  # a finished eval resumed: nothing to run, the same report
    assert {k: _eval(again, out, resume=True)[k] for k in RATES} == {k: whole[k] for k in RATES}
    assert again.calls == 0


def test_resume_refuses_other_settings_and_lets_tasks_and_attempts_grow(tmp_path):
    out = tmp_path / "e.jsonl"
    _eval(FakeClient(), out, n=2, attempts=2)
    with pytest.raises(ConfigError, match=r"seed: 3 before, 4 now") as e:
        _eval(FakeClient(), out, n=2, attempts=2, seed=4, resume=True)
    assert "without --resume" in str(e.value)
    with pytest.raises(ConfigError, match=r"attempts: 1 is fewer than the 2"):
        _eval(FakeClient(), out, n=2, attempts=1, resume=True)
    client = FakeClient()
    s = _eval(client, out, n=3, attempts=3, resume=True)
    assert (
        client.calls == 9 - 4
        and s["episodes"] == 9
        and sorted(_pairs(out)) == [(i, a) for i in range(3) for a in range(3)]
    )


def test_resume_of_an_eval_without_its_settings_file_is_refused(tmp_path):
    out = tmp_path / "old.jsonl"
    _eval(FakeClient(), out, n=1, attempts=1)
    (tmp_path / "old.config.json").unlink()
    with pytest.raises(ConfigError, match=r"old.config.json \(the settings it ran with\) is missing"):
        _eval(FakeClient(), out, n=1, attempts=1, resume=True)


def test_resume_without_a_previous_eval_starts_afresh(tmp_path):
    s = _eval(FakeClient(), tmp_path / "new.jsonl", n=2, attempts=1, resume=True)
    assert s["episodes"] == 2 and s["resumed"] == 0


def test_a_torn_last_line_is_ignored_an_earlier_one_is_an_error(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert [r for _, r in jsonl_rows(p)] == [{"a": 1}, {"a": 2}]
    p.write_text('{"a": \n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"x.jsonl:1: not JSON"):
        list(jsonl_rows(p))


def test_eval_command_resume_runs_only_what_is_missing(tmp_path):
    """The CLI flag: 2 tasks, then --resume with -n 3 asks the endpoint once more (the new task)."""
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    out = tmp_path / "yes.jsonl"
    base = ["eval", "--env", "test/Echo-v0", "--model", "openai/scripted", "--out", str(out), "-q"]
    with ScriptedOpenAI([{"content": "yes"}]) as srv:
        first = CliRunner().invoke(app, [*base, "--api-base", srv.url, "-n", "2"])
        assert first.exit_code == 0, first.output
        res = CliRunner().invoke(app, [*base, "--api-base", srv.url, "-n", "3", "--resume"])
        assert res.exit_code == 0, res.output
        assert len(srv.requests) == 3
        assert "2 of 3 attempts finished, 1 to run" in res.output
        bad = CliRunner().invoke(app, [*base, "--api-base", srv.url, "-n", "3", "--resume", "--seed", "9"])
    assert bad.exit_code == 2 and "seed: 0 before, 9 now" in bad.output
    s = json.loads(out.with_name("yes.summary.json").read_text())
    assert s["episodes"] == 3 and s["solve_rate"] == 1.0 and len(out.read_text().splitlines()) == 3
