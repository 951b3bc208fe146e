"""ConciseEnv: per-turn rewards by hand (both patterns), termination, bad kwargs, conformance, and the credit it
exists for."""

import gymnasium
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env

from agentrl.batches.samples import ALGOS, build_samples
from agentrl.envs import registry
from agentrl.envs.checker import check_agent_env
from agentrl.envs.concise import ConciseEnv
from agentrl.errors import ConfigError
from agentrl.trajectory import Outcome, Trajectory, TurnRecord


def test_turn_rewards_by_hand_and_termination():
    env = ConciseEnv()  # 4 turns, max_chars 40
    obs, info = env.reset(seed=0)
    assert obs.startswith("Turn 1 of 4: reply with one short word about ") and info["tools"] == []
    assert info["messages"] == [{"role": "user", "content": obs}] and len(info["task"]["topics"]) == 4
    # "" -> (1 - 0)/4;  4 chars -> (1 - .1)/4;  20 chars -> (1 - .5)/4;  50 chars (capped at 40) -> 0
    expected = [("", 0.25), ("abcd", 0.225), ("x" * 20, 0.125), ("y" * 50, 0.0)]
    for k, (reply, want) in enumerate(expected):
        obs, reward, term, trunc, info = env.step(reply)
        assert reward == pytest.approx(want) and trunc is False and info["chars"] == len(reply)
        assert term is (k == 3)
        if k < 3:
            assert obs.startswith(f"Turn {k + 2} of 4: ") and info["messages"] == [{"role": "user", "content": obs}]
        else:
            assert obs == "" and info["messages"] == [] and info["final"] is True
    with pytest.raises(ResetNeeded):
        env.step("again")


def test_waste_penalty_max_chars_and_n_turns():
    env = ConciseEnv(n_turns=2, max_chars=10, waste_penalty=1.0)
    env.reset(seed=1)
    # 5 of 10 chars: (1 - 2 * .5)/2 = 0;  12 chars (capped at 10): (1 - 2)/2 = -.5, and the episode ends
    assert env.step("hello")[1:3] == (pytest.approx(0.0), False)
    assert env.step("hello world!")[1:3] == (pytest.approx(-0.5), True)
    env.reset(seed=1)
    assert env.step("")[1] == pytest.approx(0.5)


def test_alternate_pattern_rewards_and_requests_by_hand():
    env = ConciseEnv(pattern="alternate")  # 4 turns, max_chars 40: turns 1, 3 want short, 2, 4 want long
    obs, info = env.reset(seed=0)
    assert obs.startswith("Turn 1 of 4: reply with one short word about ") and info["task"]["pattern"] == "alternate"
    # short "abcd" -> (1 - .1)/4;  long 20 chars -> .5/4;  short "" -> 1/4;  long 50 chars (capped at 40) -> 1/4
    expected = [("abcd", 0.225, "short"), ("x" * 20, 0.125, "long"), ("", 0.25, "short"), ("y" * 50, 0.25, "long")]
    for k, (reply, want, kind) in enumerate(expected):
        obs, reward, term, trunc, info = env.step(reply)
        assert reward == pytest.approx(want) and info["wants"] == kind and info["turn"] == k
        assert term is (k == 3) and trunc is False
        if k < 3:
            ask = "a long sentence" if k % 2 == 0 else "one short word"  # what the *next* turn asks for
            assert obs.startswith(f"Turn {k + 2} of 4: reply with {ask} about ")
    with pytest.raises(ResetNeeded):
        env.step("again")


def test_alternate_waste_penalty_hits_short_turns_only():
    env = ConciseEnv(n_turns=3, max_chars=10, waste_penalty=1.0, pattern="alternate")
    env.reset(seed=1)
    # 12 chars (capped at 10) each turn: short (1 - 2)/3 = -1/3, long 1/3, short -1/3 (the episode ends)
    assert env.step("hello world!")[1:3] == (pytest.approx(-1 / 3), False)
    assert env.step("hello world!")[1:3] == (pytest.approx(1 / 3), False)
    assert env.step("hello world!")[1:3] == (pytest.approx(-1 / 3), True)
    env.reset(seed=1)
    assert [env.step(r)[1] for r in ("", "0123456789", "")] == pytest.approx([1 / 3, 1 / 3, 1 / 3])  # return 1


@pytest.mark.parametrize("chars", [0, 4, 20, 40, 60])
def test_alternate_rewards_no_prompt_blind_policy(chars):
    # 4 turns, no waste penalty: a reply of c chars every turn earns (1 - c') + c' over two turn pairs,
    # i.e. 2 * 1/4 = .5 whatever c is, so only a policy that reads the request can beat .5
    env = ConciseEnv(pattern="alternate")
    env.reset(seed=2)
    assert sum(env.step("z" * chars)[1] for _ in range(4)) == pytest.approx(0.5)


def test_same_pattern_is_the_default_and_never_asks_for_length():
    a, b = ConciseEnv(), ConciseEnv(pattern="same")
    assert a.reset(seed=4) == b.reset(seed=4) and a.pattern == "same"
    for k in range(4):
        oa, ob = a.step("x" * 8 * k), b.step("x" * 8 * k)
        assert oa == ob and oa[4]["wants"] == "short" and "long" not in oa[0]
        assert oa[1] == pytest.approx((1 - k * 8 / 40) / 4)


def test_tasks_are_a_function_of_the_seed():
    env = ConciseEnv(n_turns=6)
    assert env.reset(seed=3) == env.reset(seed=3)
    tasks = {env.reset(seed=s)[1]["task"]["id"] for s in range(20)}
    assert len(tasks) > 15  # 16^6 topic sequences: seeds give different conversations


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"n_turns": 0}, "0"),
        ({"n_turns": 2.5}, "2.5"),
        ({"max_chars": 0}, "0"),
        ({"max_chars": "40"}, "'40'"),
        ({"waste_penalty": -1}, "-1"),
        ({"waste_penalty": float("nan")}, "nan"),
        ({"topics": []}, r"\[\]"),
        ({"topics": "rivers"}, "'rivers'"),
        ({"pattern": "mixed"}, "'mixed'"),
        ({"pattern": None}, "None"),
    ],
)
def test_bad_kwargs_name_the_field_and_value(kwargs, bad):
    name = next(iter(kwargs))
    with pytest.raises(ConfigError, match=rf"{name} .*{bad}"):
        ConciseEnv(**kwargs)
    with pytest.raises(ConfigError, match=name):
        registry.make("concise", **kwargs)


def test_registered_and_conformant():
    assert type(registry.make("concise")).__name__ == type(registry.make("Concise-v0")).__name__ == "ConciseEnv"
    assert registry.spec("concise").source == "builtin"
    env = gymnasium.make("agentrl/Concise-v0", n_turns=2)
    assert env.unwrapped.n_turns == 2
    check_env(env.unwrapped)
    assert check_agent_env("concise") == []
    assert check_agent_env("concise", n_turns=1, waste_penalty=0.5) == []
    assert check_agent_env("concise", n_turns=3, pattern="alternate") == []
    assert registry.make("concise", pattern="alternate").pattern == "alternate"


def _traj(name: str, replies: list[str], env: ConciseEnv) -> Trajectory:
    """A trajectory laid out like the episode manager's: a prompt of 2 tokens, then per turn one
    sampled token per reply character (at least 1) and 2 observation tokens (none after the last)."""
    env.reset(seed=0)
    ids, mask, tids, turns = [0, 0], [0, 0], [-1, -1], []
    for k, reply in enumerate(replies):
        reward = env.step(reply)[1]
        n_obs = 0 if k == len(replies) - 1 else 2
        n = max(len(reply), 1)
        turns.append(TurnRecord(k, len(ids), n, n_obs, "stop", reward=reward))
        ids += [1] * n + [2] * n_obs
        mask += [1] * n + [0] * n_obs
        tids += [k] * (n + n_obs)
    t = Trajectory(
        episode_id=name,
        group_id="g",
        env_id="concise",
        prompt_len=2,
        token_ids=ids,
        loss_mask=mask,
        logprobs=[0.0] * len(ids),
        turn_ids=tids,
        versions=[0 if m else -1 for m in mask],
        turns=turns,
        reward=turns[-1].reward,
        outcome=Outcome.OK,
    )
    t.validate()
    return t


def _per_turn_advantages(sample, traj) -> list[set[float]]:
    out = [set() for _ in traj.turns]
    for a, m, k in zip(sample.advantages, traj.loss_mask, traj.turn_ids):
        if m:
            out[k].add(round(a, 9))
    return out


def test_turn_return_credits_turns_apart_where_outcome_broadcasts_one_value():
    env = ConciseEnv(n_turns=2, max_chars=10)
    # a: short then long, b: long then short; same episode return (.45 + 0 = 0 + .45), so outcome
    # has nothing to separate; c: short both times
    group = [_traj("a", ["a", "x" * 10], env), _traj("b", ["x" * 10, "a"], env), _traj("c", ["a", "a"], env)]
    assert [t.turn_rewards for t in group] == [[0.45, 0.0], [0.0, 0.45], [0.45, 0.45]]
    outcome, _ = build_samples([group], ALGOS["grpo"], credit="outcome")
    turn, _ = build_samples([group], ALGOS["grpo"], credit="turn_return")
    for s, t in zip(outcome, group):
        per_turn = _per_turn_advantages(s, t)
        assert all(len(p) == 1 for p in per_turn) and len(set.union(*per_turn)) == 1  # one value, every turn
    # returns-to-go G = a [.45, 0], b [.45, .45], c [.9, .45]; position means [.6, .3]
    want = {"a": [-0.15, -0.3], "b": [-0.15, 0.15], "c": [0.3, 0.15]}
    for s, t in zip(turn, group):
        per_turn = _per_turn_advantages(s, t)
        assert [p.pop() for p in per_turn] == pytest.approx(want[t.episode_id])
    # a's long second turn is blamed on turn 1 alone; under outcome a and b get the same advantage
    assert _per_turn_advantages(outcome[0], group[0]) == _per_turn_advantages(outcome[1], group[1])
