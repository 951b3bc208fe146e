"""The word-level tokenizer of the TextWorld base (``build_tokenizer(style="words", corpus="textworld")``):
a name has the same ids in an observation and in the call that copies it, as with a real LLM's
vocabulary (the default ``agent`` tokenizer spelt TextWorld's names nearly letter by letter)."""

from __future__ import annotations

import pytest

from agentrl.envs.textworld.gen import OBJECTS, ROOMS
from agentrl.envs.textworld.world import RECEPTACLE_KINDS
from agentrl.warmstart.tiny_model import build_tokenizer


@pytest.fixture(scope="module")
def words():
    return build_tokenizer(None, style="words", corpus="textworld")


def _find(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_a_name_reads_the_same_in_an_observation_and_in_a_call(words):
    names = list(ROOMS) + ["kitchen", "bathroom"] + [f"{o} 1" for o in OBJECTS] + [f"{k} 2" for k in RECEPTACLE_KINDS]
    for name in names:
        ids = words.encode(name, add_special_tokens=False)
        assert len(ids) <= 3, (name, words.convert_ids_to_tokens(ids))  # words, not letters
        seen = f"You are in the study. You see: {name} (closed); box 3 (empty). Exits: {name}, pantry."
        call = '<tool_call>\n{"name": "open", "arguments": {"receptacle": "' + name + '"}}\n</tool_call>'
        for text in (seen, call):
            assert _find(words.encode(text, add_special_tokens=False), ids), (name, text)


def test_any_text_still_round_trips_and_the_default_tokenizer_is_untouched(words):
    text = 'print(12 + 345)  # Ünïcödé\ttab, JSON {"a": [1, 2]}'
    assert words.decode(words.encode(text, add_special_tokens=False)) == text
    default = build_tokenizer(None)
    assert len(default.encode("laundry room", add_special_tokens=False)) > 2  # spelt in pieces, as before
    assert default.get_vocab() == build_tokenizer(None, style="agent", corpus="code_exec").get_vocab()
    with pytest.raises(ValueError, match="corpus must be one of"):
        build_tokenizer(None, corpus="nope")
