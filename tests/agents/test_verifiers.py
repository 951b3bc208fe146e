"""verifiers (0.4, ``verifiers.v1``) environments trained through the proxy: a taskset built from
verifiers' own classes (``vf_reverse``), played by verifiers' own chat harness (``null``, a uv script
in a local subprocess runtime) against the recording endpoint, scored by verifiers' own reward.

Needs the real verifiers package; it is not in the ``test`` extra because verifiers 0.4 pins
``mcp==2.0.0`` while litellm[mcp] needs ``mcp>=2.2`` (install it in its own virtualenv:
``python -m venv --system-site-packages V && V/bin/pip install 'verifiers>=0.4,<0.5'``). The harness
bootstraps ``uv`` and its script's dependencies from the package index on first use."""

import asyncio
import sys
from pathlib import Path

import components
import pytest

pytest.importorskip(
    "verifiers.v1",
    reason=components.reason(
        "verifiers", "verifiers 0.4 is not installed (it pins mcp==2.0.0, which litellm[mcp] refuses)"
    ),
)

import agentrl.jobs.rollout as rollout_job  # noqa: E402
from agentrl.config.schema import load_config  # noqa: E402
from agentrl.envs.adapters.verifiers_env import VerifiersEnv  # noqa: E402
from agentrl.errors import ConfigError  # noqa: E402

HERE = str(Path(__file__).resolve().parent)
CALLABLE = "agentrl.envs.adapters.verifiers_env:run_verifiers_episode"


@pytest.fixture(autouse=True)
def _taskset_on_path(monkeypatch):
    monkeypatch.syspath_prepend(HERE)  # vf_reverse: the taskset module verifiers imports by id


def _sets(tmp_path, extra=()):
    return [
        f"output_dir={tmp_path}",
        "env.id=verifiers",
        "env.kwargs.taskset=vf_reverse",
        "agent.kind=proxy",
        f"agent.callable={CALLABLE}",
        "agent.timeout_s=300",
        "rollout.max_new_tokens=24",
        *extra,
    ]


def test_rows_splits_and_seeds():
    train, held = VerifiersEnv("vf_reverse"), VerifiersEnv("vf_reverse", split="eval")
    tr, ev = {r["idx"] for r in train.rows}, {r["idx"] for r in held.rows}
    assert tr and ev and not tr & ev and tr | ev == set(range(10))
    _, a = train.reset(seed=3)
    _, b = train.reset(seed=3 + len(train.rows))
    assert a["task"] == b["task"] and a["task"]["verifiers"]["idx"] == train.rows[3]["idx"]
    assert a["messages"][-1]["role"] == "user" and "Reverse the word" in a["messages"][-1]["content"]
    own = VerifiersEnv("vf_reverse", split="eval", eval_taskset_args={"num_tasks": 2})
    assert [r["idx"] for r in own.rows] == [0, 1]
    with pytest.raises(ConfigError, match="no_such_taskset"):
        VerifiersEnv("no_such_taskset")
    with pytest.raises(ConfigError, match="agent.kind=proxy"):
        train.step("tac")


def test_rollout_through_the_proxy_scores_with_the_rubric(tmp_path):
    cfg = load_config([], _sets(tmp_path, ["rollout.num_prompts=2", "rollout.group_size=2"]))
    trajs, metrics, _ = rollout_job.run_rollout(cfg, progress=False, note=lambda line: None)
    assert len(trajs) == 4
    for t in trajs:
        t.validate()
        agent = t.info["agent"]
        # verifiers' own loop sampled the policy (its error, if any, is in the message)
        assert agent["requests"] >= 1 and t.num_turns >= 1, (agent.get("result"), t.outcome_detail)
        result = agent["result"]
        assert result is not None and "error" not in result, result
        assert set(result["rewards"]) == {"reversed_word"}  # verifiers' reward function scored it
        if t.outcome.value == "ok":
            assert t.reward == result["reward"]
        else:
            assert t.outcome.value == "truncated_length", t.outcome_detail
    assert not any(t.outcome.value in ("env_error", "deadline", "reward_error") for t in trajs)


@pytest.mark.slow
def test_run_trains_through_the_proxy(tmp_path):
    from agentrl.jobs.run import Runner

    cfg = load_config(
        [],
        _sets(
            tmp_path,
            [
                "rollout.group_size=2",
                "train.groups_per_step=2",
                "train.steps=2",
                "train.max_staleness=0",
                "eval.num_tasks=0",
                "logging.tensorboard=false",
            ],
        ),
    )
    summary = asyncio.run(Runner(cfg, progress=False).run())
    assert summary["steps"] == 2
    assert summary["rollout"]["episodes"] >= 8 and summary["rollout"]["infra_failures"] == 0, summary["rollout"]


def test_without_verifiers_the_error_says_how_to_install(monkeypatch):
    import agentrl.envs.adapters.verifiers_env as mod

    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ConfigError, match=r"agentrl\[verifiers\]"):
        mod.import_verifiers()
