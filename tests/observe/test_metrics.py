"""Rollout metrics count failures: every task is in a solve rate's denominator, infrastructure failures
are counted beside it, and the run summary's tool counters agree with its outcomes."""

import asyncio
import json

import pytest

from agentrl.config.schema import RolloutConfig
from agentrl.engine.fake import FakeEngine
from agentrl.envs.base import ToolEnv
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec
from agentrl.observe.metrics import RolloutMetrics, episode_rates, eval_stats, rollout_stats
from agentrl.tools.base import Tool
from agentrl.trajectory import Outcome, Trajectory


def traj(i, outcome=Outcome.OK, reward=0.0, calls=1):
    t = Trajectory(episode_id=f"e{i}", group_id=f"g{i // 8}", env_id="x", prompt_len=0, reward=reward, outcome=outcome)
    t.info["tool_stats"] = {"calls": calls}
    return t


def _eval_run():
    """The issue's held-out eval: 500 tasks, 279 solved, 110 ended tool_timeout, 111 answered wrongly."""
    return (
        [traj(i, reward=1.0) for i in range(279)]
        + [traj(i, Outcome.TOOL_TIMEOUT, calls=0) for i in range(110)]
        + [traj(i) for i in range(111)]
    )


def test_solve_rate_counts_every_task_and_infra_failures_stand_beside_it():
    s = eval_stats(_eval_run())
    assert s["solve_rate"] == 279 / 500 == 0.558  # was 279 / 390 = 0.715: the timeouts left out
    assert (s["infra_failures"], s["episodes"], s["infra_failure_rate"]) == (110, 500, 0.22)
    assert s["outcome/tool_timeout"] == 110.0 and s["outcome/ok"] == 390.0
    assert s["tool_use_rate"] == 1.0  # of the trainable episodes


def test_rollout_stats_reward_is_over_trainable_episodes_and_missing_when_none():
    g = [
        traj(0, reward=1.0),
        traj(1, Outcome.TRUNCATED_LENGTH, reward=0.5),
        traj(2, Outcome.SANDBOX_ERROR),
        traj(3, Outcome.ENGINE_ERROR),
    ]
    s = rollout_stats([g[:2], g[2:]])
    assert s["solve_rate"] == 2 / 4 and s["infra_failure_rate"] == 0.5 and s["infra_failures"] == 2
    assert s["reward_mean"] == 0.75  # (1.0 + 0.5) / 2 trainable episodes
    dead = rollout_stats([[traj(0, Outcome.TOOL_TIMEOUT), traj(1, Outcome.DEADLINE)]])
    assert "reward_mean" not in dead and "tool_use_rate" not in dead  # a gap, not a reward of 0
    assert dead["solve_rate"] == 0.0 and dead["infra_failure_rate"] == 1.0


def test_one_definition_of_solved():
    # an infra failure is unsolved even if something set a reward on it; a truncated episode with reward counts
    pairs = [("ok", 1.0), ("tool_timeout", 1.0), ("truncated_length", 0.5), ("ok", 0.0), ("cancelled", 0.0)]
    assert episode_rates(pairs) == {"episodes": 5, "solve_rate": 0.4, "infra_failures": 2, "infra_failure_rate": 0.4}
    assert episode_rates([]) == {"episodes": 0, "solve_rate": 0.0, "infra_failures": 0, "infra_failure_rate": 0.0}
    m = RolloutMetrics()
    for t in _eval_run():
        m.add(t)
    s = m.summary()
    assert (s["solve_rate"], s["infra_failure_rate"], s["episodes"]) == (0.558, 0.22, 500)
    assert s["reward_mean"] == 279 / 390  # the trainable episodes' mean, as trained on
    assert s["tool_use_rate"] == 1.0  # 390 trainable episodes, each with a call (the timeouts have none)


class SlowEnv(ToolEnv):
    """One `wait` call, then an answer; the tool outlives its deadline on tasks with ``slow``."""

    def __init__(self, **kw):
        async def wait(x: int) -> str:
            """Wait.

            Args:
                x: input
            """
            await asyncio.sleep(30 if self._task["slow"] else 0)
            return str(x)

        self.tools = [Tool(wait, name="wait")]
        super().__init__(tool_timeout_s=0.2, **kw)

    def sample_task(self, rng, options):
        raise AssertionError("tasks come from options")

    def initial_messages(self, task):
        return [{"role": "user", "content": f"task {task['id']}"}]

    async def score(self, task, final_text, transcript):
        return 1.0


def test_summary_tool_timeouts_agree_with_tool_timeout_outcomes(tiny_tokenizer):
    """The issue's run summary said tool.timeouts: 0 beside outcomes.tool_timeout: 15041: an episode
    that a timed-out call ends never returns that turn's tool_stats."""
    tok = tiny_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")

    def policy(prompt_ids, params, ctx):
        first = tok.decode(prompt_ids).count("<|im_start|>assistant") == 1
        text = (
            "<tool_call>\n" + json.dumps({"name": "wait", "arguments": {"x": 1}}) + "\n</tool_call>"
            if first
            else "done"
        )
        return tok.encode(text, add_special_tokens=False) + [im_end]

    mgr = EpisodeManager(FakeEngine(policy), SlowEnv, tok, RolloutConfig(max_turns=3, turn_timeout_s=20), env_id="slow")
    specs = [EpisodeSpec(f"p{i}", 0, i, options={"task": {"id": i, "slow": i % 3 == 0}}) for i in range(6)]
    trajs = asyncio.run(asyncio.wait_for(mgr.collect(specs), 60))
    assert sorted(t.outcome.value for t in trajs) == ["ok"] * 4 + ["tool_timeout"] * 2
    s = mgr.metrics.summary()
    assert s["outcomes"]["tool_timeout"] == 2 and s["tool"]["timeouts"] == 2
    assert s["tool"]["calls"] == 4  # the calls that were answered; the timed-out ones are in timeouts
    assert (s["solve_rate"], s["infra_failure_rate"]) == (pytest.approx(4 / 6), pytest.approx(2 / 6))
