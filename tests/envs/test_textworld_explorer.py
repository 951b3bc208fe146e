"""The TextWorld explorer: solves every world through the real env, and every action it takes names
something the transcript has already shown (so a policy reading the transcript can learn it)."""

from __future__ import annotations

import copy
import random
import re

import pytest

from agentrl.envs.textworld import TextWorldEnv, generate_world, hermes_call, oracle_actions
from agentrl.envs.textworld.explorer import explorer_actions
from agentrl.envs.textworld.world import World


def _solves(env: TextWorldEnv, plan: list) -> None:
    """``plan`` played through ``env`` (just reset) solves it on its last action, with no tool error."""
    for k, action in enumerate(plan):
        _, reward, terminated, _, info = env.step(hermes_call(action))
        assert info["tool_stats"]["errors"] == 0
        assert terminated == (k == len(plan) - 1), (env.world.task_id, k, action)
    assert reward == 1.0 and info["ended_by"] == "goal"


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_explorer_solves_every_world_through_the_env_no_shorter_than_the_oracle(difficulty):
    for split in ("train", "eval"):
        env = TextWorldEnv(difficulty=difficulty, split=split)
        for seed in range(8):
            env.reset(seed=seed)
            plan = explorer_actions(env.world)
            assert len(plan) >= len(oracle_actions(env.world))
            _solves(env, plan)


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_random_tie_breaks_give_other_games_that_still_solve_and_follow_the_transcript(difficulty):
    env, differ = TextWorldEnv(difficulty=difficulty), 0
    for seed in range(8):
        env.reset(seed=seed)
        fixed = explorer_actions(env.world)
        for k in range(4):
            env.reset(seed=seed)
            plan = explorer_actions(env.world, random.Random(k))
            assert plan == explorer_actions(env.world, random.Random(k))  # seeded: reproducible
            differ += plan != fixed
            w, transcript = copy.deepcopy(env.world), env.world.look()
            for name, args in plan:
                assert all(value in transcript for value in args.values()), (seed, k, name, args)
                transcript += "\n" + w.act(name, **args)
            env.reset(seed=seed)
            _solves(env, plan)
    assert differ >= 16, differ  # most worlds have several orders; the rng must reach them


def _exits(text: str) -> list[str]:
    found = re.findall(r"Exits: ([^.]*)\.", text)
    return found[-1].split(", ") if found else []


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_every_action_names_what_the_transcript_already_showed(difficulty):
    for seed in range(25):
        w = generate_world(seed, difficulty, "train")
        plan = explorer_actions(w)
        transcript = w.look()
        for name, args in plan:
            if name == "go":
                assert args["room"] in _exits(transcript), (seed, name, args)  # an exit of this room
            for value in args.values():
                assert value in transcript, (seed, name, args)  # seen before it is used
            transcript += "\n" + w.act(name, **args)
        assert w.goal_met()


def test_explorer_by_hand_on_a_small_world():
    """Kitchen (start) - hallway - bedroom. The mug hides in the closed bedroom drawer; the target is
    the kitchen cabinet. The explorer opens the kitchen's closed cabinet first (it searches before
    it leaves), walks the first unvisited exit, opens the drawer it finds, takes, walks back, puts."""
    w = World(
        task_id="hand",
        exits={"kitchen": ["hallway"], "hallway": ["bedroom", "kitchen"], "bedroom": ["hallway"]},
        receptacles={"kitchen": ["cabinet 1", "sink 1"], "hallway": ["shelf 1"], "bedroom": ["drawer 1"]},
        goal=("mug", None, "cabinet 1"),
        room="kitchen",
        location={"mug 1": "drawer 1", "apple 1": "shelf 1"},
    )
    assert explorer_actions(w) == [
        ("open", {"receptacle": "cabinet 1"}),
        ("go", {"room": "hallway"}),
        ("go", {"room": "bedroom"}),
        ("open", {"receptacle": "drawer 1"}),
        ("take", {"obj": "mug 1"}),
        ("go", {"room": "hallway"}),
        ("go", {"room": "kitchen"}),
        ("put", {"obj": "mug 1", "receptacle": "cabinet 1"}),
    ]
    assert w.room == "kitchen" and w.location["mug 1"] == "drawer 1"  # it plans on a copy
    assert oracle_actions(w)[0] == ("go", {"room": "hallway"})  # the oracle knows where the mug is
