"""The episode manager keeps the named reward components an env reports in its step info, summed over
the episode into Trajectory.info["reward_components"] (what GDPO normalises); a malformed one is the env's
error."""

import asyncio
import math

import numpy as np
import pytest

from agentrl.config.schema import RolloutConfig
from agentrl.engine.fake import FakeEngine
from agentrl.envs.noop import NoopEnv
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec
from agentrl.trajectory import Outcome


def _fixed(tok, text, stop=True):
    ids = tok.encode(text, add_special_tokens=False) + ([tok.convert_tokens_to_ids("<|im_end|>")] if stop else [])
    return lambda p, params, ctx: ids


class Parts(NoopEnv):
    """Three turns; each step pays 0.5 for format, the last one also 1 for correctness."""

    def __init__(self, parts=None, **kw):
        super().__init__(n_turns=3, **kw)
        self.parts = parts

    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        parts = self.parts or ({"format": 0.5, "correct": 1.0} if terminated else {"format": 0.5})
        return obs, float(sum(parts.values())), terminated, truncated, {**info, "reward_components": parts}


def _run(tok, env, **cfg):
    mgr = EpisodeManager(FakeEngine(_fixed(tok, "hi")), env, tok, RolloutConfig(**cfg))
    return asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, 0)))


def test_components_are_summed_over_the_episode(tiny_tokenizer):
    t = _run(tiny_tokenizer, Parts)
    assert t.outcome == Outcome.OK and t.num_turns == 3
    # format 0.5 on each of 3 steps, correct 1 on the last; they add up to the turn rewards
    assert t.info["reward_components"] == {"format": 1.5, "correct": 1.0}
    assert sum(t.turn_rewards) == pytest.approx(2.5)


def test_an_env_without_components_records_none(tiny_tokenizer):
    t = _run(tiny_tokenizer, lambda: NoopEnv(n_turns=2))
    assert t.outcome == Outcome.OK and "reward_components" not in t.info


def test_numpy_numbers_are_numbers(tiny_tokenizer):
    t = _run(tiny_tokenizer, lambda: Parts({"a": np.float32(0.25), "b": np.int64(2)}))
    assert t.info["reward_components"] == {"a": 0.75, "b": 6.0}


@pytest.mark.parametrize(
    "parts,needle",
    [
        ([("a", 1.0)], "info['reward_components'] must map names to numbers, got list"),
        ({"a": "high"}, "info['reward_components']['a']: 'high' is not a finite number"),
        ({"a": math.nan}, "info['reward_components']['a']: nan is not a finite number"),
        ({"a": True}, "info['reward_components']['a']: True is not a finite number"),
        ({"": 1.0}, "a component name must be a non-empty string"),
    ],
)
def test_malformed_components_are_the_envs_error(tiny_tokenizer, parts, needle):
    class Bad(Parts):
        def step(self, action):
            obs, r, term, trunc, info = super().step(action)
            return obs, 0.0, term, trunc, {**info, "reward_components": parts}

    t = _run(tiny_tokenizer, Bad)
    assert t.outcome == Outcome.ENV_ERROR and needle in t.outcome_detail
    assert "reward_components" not in t.info  # a failed episode keeps no partial sums


def test_a_scored_truncated_turn_reports_its_components(tiny_tokenizer):
    class Scored(NoopEnv):
        def step(self, action):
            return "", 0.25, True, False, {"messages": [], "reward_components": {"partial": 0.25}}

    t = _run(tiny_tokenizer, Scored, max_new_tokens=1, score_truncated=True)
    assert t.outcome == Outcome.TRUNCATED_LENGTH and t.info["reward_components"] == {"partial": 0.25}
