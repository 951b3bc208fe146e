"""TextWorld-v0: determinism, the disjoint eval split, the oracle solving every world within the
turn limit, path-independent state keys, rewards, the env contract, and (with the real episode
manager and a noisy-oracle scripted engine) per-turn state keys feeding GiGPO credit."""

import asyncio
import random

import pytest

import agentrl
from agentrl.envs.registry import make, spec
from agentrl.envs.textworld import TextWorldEnv, generate_world, hermes_call, oracle_actions
from agentrl.envs.textworld.gen import PLAN_TURNS
from agentrl.errors import ConfigError


def test_registered_with_alias_eval_split_and_turn_hint():
    assert spec("TextWorld-v0").max_turns == 40 and spec("textworld").entry_point == spec("TextWorld-v0").entry_point
    assert agentrl.check_agent_env("textworld") == []
    assert make("textworld", split="eval").split == "eval"
    with pytest.raises(ConfigError, match="difficulty"):
        TextWorldEnv(difficulty=7)
    with pytest.raises(ConfigError, match="split"):
        TextWorldEnv(split="test")


def test_worlds_are_deterministic_per_seed_and_splits_disjoint():
    a, b = generate_world(5, 2, "train"), generate_world(5, 2, "train")
    assert a == b and a.state_key() == b.state_key()
    assert generate_world(6, 2, "train").task_id != a.task_id
    train = {generate_world(s, 2, "train").task_id for s in range(150)}
    held = {generate_world(s, 2, "eval").task_id for s in range(150)}
    assert len(train) > 140 and len(held) > 140 and not train & held
    env1, env2 = TextWorldEnv(), TextWorldEnv()
    assert env1.reset(seed=11)[1]["task"] == env2.reset(seed=11)[1]["task"]


def test_a_fixed_set_of_worlds_folds_task_seeds():
    env = TextWorldEnv(difficulty=1, worlds=3)
    ids = {env.reset(seed=s)[1]["task"]["id"] for s in range(40)}
    assert len(ids) == 3
    assert len({TextWorldEnv(difficulty=1).reset(seed=s)[1]["task"]["id"] for s in range(40)}) > 30
    held = {TextWorldEnv(difficulty=1, worlds=3, split="eval").reset(seed=s)[1]["task"]["id"] for s in range(40)}
    assert len(held) == 3 and not held & ids
    with pytest.raises(ConfigError, match="worlds"):
        TextWorldEnv(worlds=-1)


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_oracle_solves_every_world_within_the_turn_limit(difficulty):
    lo, hi = PLAN_TURNS[difficulty]
    env = TextWorldEnv(difficulty=difficulty)
    for seed in range(40):
        env.reset(seed=seed)
        plan = env.oracle_actions()
        assert lo <= len(plan) <= hi <= spec("textworld").max_turns
        for k, action in enumerate(plan):
            _, reward, terminated, _, info = env.step(hermes_call(action))
            assert info["tool_stats"]["errors"] == 0
            assert terminated == (k == len(plan) - 1)
        assert reward == 1.0 and info["ended_by"] == "goal"


def test_default_difficulty_needs_10_to_30_turns():
    lengths = [len(oracle_actions(generate_world(s, 2, "train"))) for s in range(100)]
    assert min(lengths) >= 10 and max(lengths) <= 30


def test_state_key_depends_on_the_state_not_the_path():
    w = generate_world(3, 2, "train")
    start = w.state_key()
    assert w.look() and w.inventory() and w.state_key() == start  # observing changes nothing
    assert "cannot go" in w.go("nowhere") and w.state_key() == start  # a mistake changes nothing
    there = w.exits[w.room][0]
    w.go(there)
    assert w.state_key() != start
    back = next(r for r in w.exits[there] if r == generate_world(3, 2, "train").room)
    w.go(back)
    assert w.state_key() == start  # there and back again: the same state
    closed = next((r for r in w.receptacles[w.room] if w.openable(r)), None)
    assert closed, "world 3 has an openable receptacle in its start room: the open/close check must run"
    w.open(closed)
    assert w.state_key() != start
    w.close(closed)
    assert w.state_key() == start
    # the oracle's plan from a state reached by a detour ends in the same goal state as the direct plan
    direct, detour = generate_world(3, 2, "train"), generate_world(3, 2, "train")
    detour.go(detour.exits[detour.room][0])
    for world in (direct, detour):
        for name, args in oracle_actions(world):
            world.act(name, **args)
    assert direct.goal_met() and detour.goal_met()
    # in world 3 both plans end in the same room with the same receptacles open: the same state, the same key
    assert (direct.room, direct.opened) == (detour.room, detour.opened)
    assert direct.state_key() == detour.state_key()


def test_rules_and_rewards():
    env = TextWorldEnv(step_cost=0.01)
    env.reset(seed=2)
    w = env.world
    assert "hold nothing" in w.inventory()
    assert "need to hold" in w.treat("clean", "mug 1")
    plan = env.oracle_actions()
    for action in plan[:-1]:
        env.step(hermes_call(action))
    _, reward, terminated, _, _ = env.step(hermes_call(plan[-1]))
    assert terminated and reward == pytest.approx(1.0 - 0.01 * len(plan))
    env.reset(seed=2)
    _, reward, terminated, _, info = env.step("I give up.")  # a reply without a call ends it, unsolved
    assert terminated and reward == 0.0 and info["final"]
    env.reset(seed=2)
    two = hermes_call(("look", {})) + "\n" + hermes_call(("inventory", {}))
    _, _, terminated, _, info = env.step(two)  # one action per turn
    assert not terminated and info["tool_stats"]["over_limit"] == 1


def test_episode_manager_records_state_keys_and_gigpo_uses_them(tiny_tokenizer):
    from agentrl.batches.samples import token_advantages
    from agentrl.engine.fake import FakeEngine
    from agentrl.episodes.config import RolloutConfig
    from agentrl.episodes.manager import EpisodeManager, make_specs

    tok = tiny_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    envs: list[TextWorldEnv] = []

    def factory():
        envs.append(TextWorldEnv(step_cost=0.01))
        return envs[-1]

    def policy(prompt_ids, params, ctx):  # a noisy oracle: one episode at a time, so envs[-1] is its env
        env = envs[-1]
        rng = random.Random(f"{len(envs)}/{env.turns}")
        if rng.random() < 0.3:
            action = ("go", {"room": rng.choice(env.world.exits[env.world.room])})
        else:
            action = env.oracle_actions()[0]
        return tok.encode(hermes_call(action), add_special_tokens=False) + [im_end]

    cfg = RolloutConfig(max_turns=14, max_context=100_000, max_new_tokens=256, max_concurrency=1)
    mgr = EpisodeManager(FakeEngine(policy), factory, tok, cfg, env_id="textworld")
    trajs = asyncio.run(mgr.collect(make_specs(2, 4, seed=1)))
    for t in trajs:
        t.validate()
        assert t.trainable and all(r.state_key for r in t.turns)
        assert t.turns[0].state_key == next(u for u in trajs if u.group_id == t.group_id).turns[0].state_key
    assert len({t.reward for t in trajs}) > 1, [t.reward for t in trajs]
    stats = {}
    adv, _, _ = token_advantages(trajs, "grpo", "gigpo", gamma=0.95, credit_stats=stats)
    assert stats["anchor_group_size_max"] >= 4 and stats["anchor_turns_shared"] > 8
    assert any(abs(a) > 1e-6 for row in adv for a in row)
    outcome, _, _ = token_advantages(trajs, "grpo", "outcome")
    assert adv != outcome  # the step level changed something


def test_state_key_falls_back_to_the_observation_hash():
    from agentrl.envs.noop import NoopEnv
    from agentrl.episodes.manager import state_key_of

    env = NoopEnv()
    assert state_key_of(env, "hello") == state_key_of(env, "hello") != state_key_of(env, "other")
    assert state_key_of(env, "hello").startswith("obs:")
    tw = TextWorldEnv()
    tw.reset(seed=0)
    assert state_key_of(tw, "ignored") == tw.world.state_key()


@pytest.mark.slow
def test_agentrl_run_textworld_with_gigpo_end_to_end(tiny_model_dir, tmp_path):
    """``agentrl run --env textworld --algo grpo --set algo.credit=gigpo``, shortened: 2 steps of 2 groups
    x 4 samples on the tiny model. Every group shares its first state, so anchor groups of size > 1
    exist whatever the (random) model writes; state keys are recorded and saved with the trajectories."""
    import json

    from agentrl.config.schema import load_config
    from agentrl.jobs.run import Runner
    from agentrl.trajectory import read_jsonl

    out = tmp_path / "run"
    cfg = load_config(
        [],
        [
            f"output_dir={out}",
            f"model.path={tiny_model_dir}",
            "env.id=textworld",
            "algo.name=grpo",
            "algo.credit=gigpo",
            "algo.gigpo_omega=1.0",
            "rollout.max_new_tokens=24",
            "rollout.max_turns=3",
            "rollout.group_size=4",
            "rollout.temperature=1.0",
            "train.groups_per_step=2",
            "train.steps=2",
            "train.max_staleness=0",
            "eval.num_tasks=0",
            "logging.tensorboard=false",
            "logging.trajectories_per_step=-1",
        ],
    )
    summary = asyncio.run(Runner(cfg, progress=False).run())
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shared = [r["credit/anchor_turns_shared"] for r in rows if "credit/anchor_turns_shared" in r]
    assert len(shared) == 2 and all(s >= 8 for s in shared), rows  # turn 0 of each group of 4, at least
    saved = [t for p in sorted((out / "trajectories").glob("step_*.jsonl")) for t in read_jsonl(p)]
    assert saved and all(r.state_key for t in saved if t.trainable for r in t.turns)


@pytest.mark.parametrize("planner", ["explorer", "oracle"])
def test_demonstrations_are_token_exact_successes(tiny_tokenizer, planner):
    from agentrl.warmstart.textworld_demos import textworld_demonstrations

    demos = textworld_demonstrations(tiny_tokenizer, 6, difficulty=[1, 2, 3], seed=3, planner=planner)
    assert len(demos) == 6
    for d in demos:
        assert len(d.token_ids) == len(d.loss_mask) and d.loss_mask[0] == 0
        sampled = tiny_tokenizer.decode([i for i, m in zip(d.token_ids, d.loss_mask) if m])
        assert sampled.count("<tool_call>") >= 8 and '"name": "put"' in sampled  # the model's turns: the plan
        assert "You are in the" not in sampled  # observations are never trained on
    with pytest.raises(ValueError, match="planner must be one of"):
        textworld_demonstrations(tiny_tokenizer, 1, planner="random")


def test_demonstration_variants_are_varied_successful_games_of_the_same_worlds(tiny_tokenizer):
    from agentrl.warmstart.textworld_demos import textworld_demonstrations

    one = textworld_demonstrations(tiny_tokenizer, 3, difficulty=[1], seed=5)
    many = textworld_demonstrations(tiny_tokenizer, 3, difficulty=[1], seed=5, variants=6)
    assert {d.source for d in many} == {d.source for d in one}  # the same worlds, played more ways
    for world in {d.source for d in one}:
        games = [tuple(d.token_ids) for d in many if d.source == world]
        assert 2 <= len(set(games)) <= len(games) <= 6, world  # one game per plan, several different
    with pytest.raises(ValueError, match="variants must be an int >= 1, got 0"):
        textworld_demonstrations(tiny_tokenizer, 1, variants=0)
    with pytest.raises(ValueError, match="varies the explorer's plans; planner is 'oracle'"):
        textworld_demonstrations(tiny_tokenizer, 1, planner="oracle", variants=2)
