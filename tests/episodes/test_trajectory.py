import math
import random

import pytest

from agentrl.trajectory import Outcome, Trajectory, TurnRecord, load, save


def _traj(seed: int) -> Trajectory:
    rng = random.Random(seed)
    prompt = [rng.randrange(2000) for _ in range(rng.randint(3, 20))]
    t = Trajectory(
        episode_id=f"e{seed}",
        group_id="g",
        env_id="code_exec",
        prompt_len=len(prompt),
        task={"id": seed, "answer": "42", "nested": {"ü": [1, 2.5]}},
        messages=[{"role": "user", "content": "héllo \x00 \u2603 \n"}],
        tools=[{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}],
        info={"tool_stats": {"calls": 2}},
    )
    t.token_ids, t.loss_mask = list(prompt), [0] * len(prompt)
    t.logprobs, t.turn_ids, t.versions = [0.0] * len(prompt), [-1] * len(prompt), [-1] * len(prompt)
    for turn in range(3):
        n, m = rng.randint(1, 9), rng.randint(0, 5)
        t.turns.append(TurnRecord(turn, len(t.token_ids), n, m, "stop", reward=rng.random(), gen_s=rng.random()))
        t.token_ids += [rng.randrange(2000) for _ in range(n + m)]
        t.loss_mask += [1] * n + [0] * m
        # awkward floats: subnormal, tiny, values that do not round-trip through float32
        t.logprobs += [-rng.random() / 3.0 for _ in range(n - 1)] + [-5e-324] + [0.0] * m
        t.turn_ids += [turn] * (n + m)
        t.versions += [turn + 7] * n + [-1] * m
    t.reward, t.outcome, t.wall_s = 1 / 3, Outcome.TRUNCATED_TURNS, math.pi
    t.validate()
    return t


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_is_lossless(tmp_path, suffix):
    trajs = [_traj(s) for s in range(20)]
    path = tmp_path / f"t{suffix}"
    assert save(path, trajs) == 20
    back = load(path)
    assert [b.to_dict() for b in back] == [t.to_dict() for t in trajs]
    assert all(isinstance(b.outcome, Outcome) for b in back)
    assert back[0].logprobs == trajs[0].logprobs  # bit-exact floats


def test_validate_catches_inconsistent_arrays():
    t = _traj(1)
    t.loss_mask.append(1)
    with pytest.raises(ValueError, match="loss_mask"):
        t.validate()
    t = _traj(2)
    t.versions[t.prompt_len] = 3  # a sampled token may carry any version
    t.validate()
    t.versions[0] = 3  # a prompt token may not
    with pytest.raises(ValueError, match="versions"):
        t.validate()
    t.versions[0] = -1
    t.loss_mask[0] = 1
    with pytest.raises(ValueError, match="prompt"):
        t.validate()


def test_outcome_trainable_split():
    assert Outcome.OK.trainable and Outcome.CONTEXT_OVERFLOW.trainable
    for o in ("tool_timeout", "sandbox_error", "engine_error", "env_error", "reward_error"):
        assert not Outcome(o).trainable


def test_unknown_field_rejected(tmp_path):
    d = _traj(3).to_dict()
    d["bogus"] = 1
    with pytest.raises(ValueError, match="bogus"):
        Trajectory.from_dict(d)


def test_lone_surrogates_are_written_as_valid_utf8(tmp_path):
    # a tool name "\ud83d" (a JSON escape in model output) made write_jsonl raise UnicodeEncodeError
    t = _traj(4)
    t.messages = [{"role": "tool", "name": "\ud83d", "content": "pair \ud83d\ude00 lone \udc00 end"}]
    t.task["k\ud800"] = "v"
    path = tmp_path / "t.jsonl"
    save(path, [t, _traj(5)])
    raw = path.read_bytes()
    raw.decode("utf-8")  # strict: every byte sequence valid
    back = load(path)
    assert back[0].messages[0] == {"role": "tool", "name": "\ufffd", "content": "pair \U0001f600 lone \ufffd end"}
    assert "k\ufffd" in back[0].task and back[1].to_dict() == _traj(5).to_dict()
