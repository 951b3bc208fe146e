"""The recorder as pure functions: prefix extension stitching, history-rewrite splitting, aligned arrays."""

import pytest

from agentrl.agents.recorder import Recorder, covered, extends, message_key
from agentrl.trajectory import Trajectory


def _traj(seg):
    t = Trajectory(
        "e", "g", "env", seg.prompt_len, seg.ids, seg.mask, seg.logprobs, seg.turn_ids, seg.versions, seg.turns
    )
    t.validate()
    return t


def test_a_prompt_extending_the_segment_is_stitched_as_mask0_context_then_sampled_ids():
    r = Recorder()
    assert r.record([1, 2, 3], [10, 11], [-0.1, -0.2], [0, 0], "stop") == "first"
    assert r.record([1, 2, 3, 10, 11, 20, 21], [12], [-0.3], [1], "stop") == "extend"
    (seg,) = r.segments
    assert seg.ids == [1, 2, 3, 10, 11, 20, 21, 12]
    assert seg.mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert seg.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3]
    assert seg.versions == [-1, -1, -1, 0, 0, -1, -1, 1]
    assert seg.turn_ids == [-1, -1, -1, 0, 0, 0, 0, 1]
    assert [(t.start, t.n_sampled, t.n_observation) for t in seg.turns] == [(3, 2, 2), (7, 1, 0)]
    _traj(seg)


def test_a_rewritten_history_closes_the_segment_and_starts_a_new_one():
    r = Recorder()
    r.record([1, 2, 3], [10, 11], [-0.1, -0.2], [0, 0], "stop")
    assert r.record([1, 2, 3, 99, 20], [12, 13], [-0.5, -0.6], [0, 0], "length") == "split"
    assert len(r.segments) == 2
    first, second = r.segments
    assert first.ids == [1, 2, 3, 10, 11] and second.ids == [1, 2, 3, 99, 20, 12, 13]
    assert second.prompt_len == 5 and second.mask == [0] * 5 + [1, 1]
    assert second.turns[0].finish_reason == "length"
    r.set_reward(0.5)
    assert first.turns[-1].reward == second.turns[-1].reward == 0.5
    for seg in r.segments:
        _traj(seg)


def test_a_shorter_prompt_than_the_segment_is_a_split_not_an_extension():
    assert not extends([1, 2, 3], [1, 2])
    assert extends([1, 2], [1, 2])
    r = Recorder()
    r.record([1, 2, 3], [4], [-1.0], [0], "stop")
    assert r.record([1, 2], [5], [-1.0], [0], "stop") == "split"


def test_misaligned_arrays_are_refused():
    with pytest.raises(ValueError, match="2 sampled ids, 1 logprobs"):
        Recorder().record([1], [2, 3], [-1.0], [0, 0], "stop")


def test_message_keys_ignore_call_ids_and_client_extras_but_not_arguments():
    sent = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "python", "arguments": '{"code": "1"}'}}
        ],
    }
    back = {
        "role": "assistant",
        "content": "",
        "refusal": None,
        "tool_calls": [
            {"id": "call_b", "type": "function", "function": {"name": "python", "arguments": '{"code":"1"}'}}
        ],
    }
    other = {**back, "tool_calls": [{"function": {"name": "python", "arguments": '{"code": "2"}'}}]}
    assert message_key(sent) == message_key(back) != message_key(other)
    history = [{"role": "user", "content": "q"}, sent]
    assert (
        covered(
            history,
            [{"role": "user", "content": [{"type": "text", "text": "q"}]}, back, {"role": "tool", "content": "1"}],
        )
        == 2
    )
    assert covered(history, [{"role": "user", "content": "q"}, other]) is None
    assert covered([], [{"role": "user", "content": "q"}]) is None
