"""ProxyStrategy's outcomes and counters, without a model: how an episode ends from what the agent
program and the env did, the per-step increase of the counters, and an eval strategy's own counts."""

import asyncio

import pytest

from agentrl.agents.config import AgentConfig
from agentrl.agents.program import ProgramResult, run_callable
from agentrl.agents.proxy import Budget, EpisodeLink, ProxyEndpoint
from agentrl.agents.strategy import COUNTERS, ProxyStrategy, proxy_strategy_of
from agentrl.trajectory import Outcome, Trajectory


class FakeEnv:
    """Fake env: ``step`` ends the episode (reward 1) only on a text containing ``ANSWER``."""

    def __init__(self):
        self.steps = []

    def step(self, action):
        self.steps.append(action)
        done = "ANSWER" in action
        return "", 1.0 if done else 0.0, done, False, {}


def _strategy(**kw):
    cfg = AgentConfig(kind="proxy", command="true", **kw)
    return ProxyStrategy(cfg, ProxyEndpoint(cfg.model_name, max_tokens=64))


def _link(last_text, finish="stop"):
    budget = Budget(8, 64, 1024, 8, 1.0, 1.0, 0)
    link = EpisodeLink("ep", tokenizer=None, budget=budget)
    link.recorder.record([1, 2], [3, 4], [-0.1, -0.2], [0, 0], finish)
    link.last_text = last_text
    return link


def _finish(strategy, link, res, env=None, score_truncated=False):
    traj = Trajectory(episode_id="ep", group_id="g", env_id="e", prompt_len=2)
    asyncio.run(strategy._finish(traj, env or FakeEnv(), link, res, score_truncated))
    return traj


def test_env_reward_when_the_env_ends_the_episode():
    strategy = _strategy(reward="env")
    traj = _finish(strategy, _link("so the ANSWER is 4"), ProgramResult())
    assert (traj.outcome, traj.reward) == (Outcome.OK, 1.0)


def test_the_envs_reward_components_are_kept_when_it_scores_the_episode():
    class Parts(FakeEnv):
        def step(self, action):
            obs, r, done, trunc, info = super().step(action)
            return obs, r, done, trunc, {**info, "reward_components": {"correct": r, "format": 0.5}}

    traj = _finish(_strategy(reward="env"), _link("so the ANSWER is 4"), ProgramResult(), Parts())
    assert traj.info["reward_components"] == {"correct": 1.0, "format": 0.5}
    # the env did not end the episode: reward 0 and no components
    traj = _finish(_strategy(reward="env"), _link("no answer"), ProgramResult(), Parts())
    assert traj.reward == 0.0 and "reward_components" not in traj.info


def test_a_program_that_stops_while_the_model_calls_tools_is_truncated_not_an_infra_failure():
    strategy = _strategy(reward="env")
    traj = _finish(strategy, _link('<tool_call>{"name": "python"}</tool_call>'), ProgramResult())
    assert traj.outcome == Outcome.TRUNCATED_TURNS and traj.outcome.trainable and traj.reward == 0.0
    assert strategy.totals()["unfinished"] == 1 and strategy.totals()["no_reward"] == 0


@pytest.mark.parametrize("score_truncated, reward", [(False, 0.0), (True, 1.0)])
def test_a_cut_last_reply_is_scored_by_the_env_only_with_score_truncated(score_truncated, reward):
    env = FakeEnv()
    traj = _finish(
        _strategy(reward="env"), _link("the ANSWER is", finish="length"), ProgramResult(), env, score_truncated
    )
    assert (traj.outcome, traj.reward) == (Outcome.TRUNCATED_LENGTH, reward)
    assert env.steps == (["the ANSWER is"] if score_truncated else [])


@pytest.mark.parametrize(
    "res, link_stop, outcome, counter",
    [
        (ProgramResult(timed_out=True, error="past"), None, Outcome.DEADLINE, "program_timeouts"),
        (ProgramResult(error="exited with code 3"), None, Outcome.ENV_ERROR, "program_crashes"),
        (
            ProgramResult(error="503"),
            ("truncated_turns", "reached max_turns=8"),
            Outcome.TRUNCATED_TURNS,
            "budget_stops",
        ),
        (ProgramResult(result={"final": "x"}), None, Outcome.REWARD_ERROR, "no_reward"),
    ],
)
def test_each_ending_is_typed_and_counted(res, link_stop, outcome, counter):
    strategy = _strategy(reward="program")
    link = _link("x")
    link.stopped = link_stop
    traj = _finish(strategy, link, res)
    assert traj.outcome == outcome and traj.reward == 0.0
    assert {k: v for k, v in strategy.totals().items() if v} == {counter: 1}


def test_take_step_gives_the_increase_since_the_last_step_and_totals_keep_counting():
    strategy = _strategy()
    strategy.counts.update({"episodes": 4, "requests": 9})
    assert strategy.take_step() == {**dict.fromkeys(COUNTERS, 0), "episodes": 4, "requests": 9}
    strategy.counts.update({"episodes": 2, "split_trajectories": 1})
    step = strategy.take_step()
    assert (step["episodes"], step["requests"], step["split_trajectories"]) == (2, 0, 1)
    assert strategy.take_step() == dict.fromkeys(COUNTERS, 0)
    assert strategy.totals()["episodes"] == 6 and strategy.totals()["requests"] == 9


def test_a_sibling_shares_program_and_endpoint_but_not_counters():
    strategy = _strategy()
    strategy.counts["episodes"] = 3
    eval_strategy = strategy.sibling()
    assert eval_strategy.endpoint is strategy.endpoint and eval_strategy.cfg is strategy.cfg
    assert eval_strategy.totals()["episodes"] == 0


def test_proxy_strategy_of_finds_only_a_proxy_strategy():
    strategy = _strategy()
    assert proxy_strategy_of(type("M", (), {"strategy": strategy})()) is strategy
    assert proxy_strategy_of(type("M", (), {"strategy": None})()) is None
    assert proxy_strategy_of(object()) is None  # e.g. the Ray backend's episode workers


async def _raises_cancelled(task, *, base_url, api_key):
    raise asyncio.CancelledError()  # as a library's cancel scope can, with nobody cancelling


def test_a_cancelled_error_from_the_agent_is_its_failure_not_a_lost_episode():
    res = asyncio.run(run_callable(_raises_cancelled, "http://x/v1", "k", {}, 5.0))
    assert res.error == "the agent callable raised CancelledError without being cancelled" and not res.timed_out


def test_cancelling_the_episode_still_cancels_its_agent():
    async def main():
        started = asyncio.Event()

        async def slow(task, *, base_url, api_key):
            started.set()
            await asyncio.sleep(60)

        episode = asyncio.create_task(run_callable(slow, "http://x/v1", "k", {}, 120.0))
        await started.wait()
        episode.cancel()
        with pytest.raises(asyncio.CancelledError):
            await episode

    asyncio.run(main())


class WorkspaceEnv(FakeEnv):
    """An env with a workspace: it scores the files the program left (1.0 when ``a.txt`` holds ``x``)."""

    def __init__(self):
        super().__init__()
        self.checked = []

    async def check_workspace(self, files):
        self.checked.append(dict(files))
        ok = files.get("a.txt") == b"x"
        return (1.0 if ok else 0.0), ("a.txt holds x" if ok else "a.txt does not hold x")


@pytest.mark.parametrize("files, reward", [({"a.txt": b"x"}, 1.0), ({}, 0.0)])
def test_a_workspace_env_scores_the_files_the_program_left_not_its_final_text(files, reward):
    """A harness may end on a tool call (mini-swe-agent submits with one): the env never steps on it."""
    env = WorkspaceEnv()
    link = _link('<tool_call>{"name": "bash"}</tool_call>')
    traj = Trajectory(episode_id="ep", group_id="g", env_id="e", prompt_len=2)
    strategy = _strategy(reward="env")
    asyncio.run(strategy._finish(traj, env, link, ProgramResult(files=files), False, workspace=True))
    assert (traj.outcome, traj.reward) == (Outcome.OK, reward)
    assert env.steps == [] and env.checked == [files]
    assert traj.info["agent"]["check"].startswith("a.txt")
    # a cut last reply: scored from the files only with rollout.score_truncated, as the built-in loop
    for score_truncated, expected in ((False, 0.0), (True, reward)):
        cut = Trajectory(episode_id="ep", group_id="g", env_id="e", prompt_len=2)
        asyncio.run(
            strategy._finish(cut, env, _link("cut", "length"), ProgramResult(files=files), score_truncated, True)
        )
        assert (cut.outcome, cut.reward) == (Outcome.TRUNCATED_LENGTH, expected)
    assert env.steps == []
