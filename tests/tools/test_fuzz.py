"""Fuzz suite (issue 20): model output is data. Property tests (hypothesis, fixed budget,
derandomized) of the tool-call parsers, the rule scorers, the ``code_exec`` env step and whole
episodes on the FakeEngine, plus hand-written regressions of the bugs the fuzzing found. Every
property: never raises, results typed correctly (a model's text never ends an episode as an
infrastructure failure), returns within a generous bound. The long run is ``bench/bench_fuzz.py``.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from fuzz_texts import (
    MAX_CHARS,
    PIECES,
    ScriptedPolicy,
    check_env_step,
    check_episode,
    check_parsers,
    check_scorers,
    episode_manager,
    hostile_text,
    make_env,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.trajectory import Outcome, read_jsonl

# "Returns within": a hang guard, not a timing test. The bugs took 3-90 s; a healthy full-size (16k chars)
# input takes at most 0.12 s here (env step; parsers 0.02 s, scorers 0.09 s over 200 hostile texts), so
# 5 s is ~40x that. (The quadratic paths themselves are pinned by cost ratios in test_rewards/test_toolcall.)
HANG_S = 5.0


def _budget(n: int):
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )


def _texts(max_chars: int = MAX_CHARS, raw_surrogates: bool = True):
    """Hypothesis's own strings and compositions of PIECES (small, shrinkable), and for most
    examples the hostile generator at sizes up to ``max_chars`` (where quadratic paths show)."""
    alphabet = st.characters() if raw_surrogates else st.characters(exclude_categories=("Cs",))
    # a seeded generator rather than st.randoms(): hypothesis cannot draw 16k-character pieces itself
    hostile = st.builds(
        lambda seed, n: hostile_text(random.Random(seed), n, raw_surrogates=raw_surrogates),
        st.integers(0, 2**32),
        st.sampled_from([max_chars, max_chars, max_chars // 4, 1024, 64]),
    )
    small = st.one_of(
        st.text(alphabet, max_size=300),
        st.lists(st.sampled_from([p for p in PIECES if raw_surrogates or not _has_surrogate(p)]), max_size=200).map(
            "".join
        ),
    )
    return st.one_of(hostile, small)  # about half each


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    assert time.perf_counter() - t0 < HANG_S, f"took {time.perf_counter() - t0:.1f} s on {len(args[0])} chars"
    return out


# ------------------------------------------------------------------ properties
@_budget(500)
@given(_texts())
def test_parsers_never_raise_and_type_every_attempt(text):
    _timed(check_parsers, text)


@_budget(500)
@given(_texts(), st.sampled_from(["42", "1/3", "-0.5", "1e5", "x^{2}", "yes"]))
def test_scorers_never_raise_and_return_zero_or_one(text, truth):
    _timed(check_scorers, text, truth)


@_budget(300)
@given(_texts(), st.sampled_from(["hermes", "python_block"]), st.sampled_from([1, 5]))
def test_env_step_types_every_turn(text, parser, difficulty):
    env = make_env(parser, difficulty)
    try:
        t0 = time.perf_counter()
        asyncio.run(check_env_step(env, text))
        assert time.perf_counter() - t0 < HANG_S
    finally:
        env.close()


@_budget(200)
@given(st.integers(0, 2**32))
def test_full_size_hostile_turns_through_parser_scorer_and_env(seed):
    # every example max_new_tokens-sized: where a quadratic path would show
    text = hostile_text(random.Random(seed), MAX_CHARS)
    _timed(check_parsers, text)
    _timed(check_scorers, text)
    env = make_env()
    try:
        _timed(lambda t: asyncio.run(check_env_step(env, t)), text)
    finally:
        env.close()


@pytest.fixture(scope="module")
def episodes(tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, max_new_tokens=1024)
    return policy, episode_manager(tiny_tokenizer, policy)


@_budget(60)
@given(st.lists(_texts(4000, raw_surrogates=False), min_size=1, max_size=3), st.integers(0, 2**16))
def test_whole_episodes_end_trainable_and_are_written(episodes, tmp_path, turns, seed):
    policy, mgr = episodes
    t0 = time.perf_counter()
    policy.start(turns)
    asyncio.run(check_episode(mgr, seed, tmp_path / f"{seed}.jsonl"))
    assert time.perf_counter() - t0 < HANG_S * 2


# ------------------------------------------------------------------ regressions (each failed before the fix)
def test_deep_argument_in_an_earlier_turn_does_not_fail_scoring():
    # json.loads accepted ~490-deep arguments; deep-copying the transcript for score() then hit the
    # recursion limit and the episode ended reward_error. Now such a call is malformed up front.
    for depth in range(300, 520, 15):
        env = make_env()
        env.reset(seed=0)
        _, _, done, _, info = env.step(
            '<tool_call>{"name": "python", "arguments": {"code": "1", "x": '
            + "[" * depth
            + "]" * depth
            + "}}</tool_call>"
        )
        assert not done and info["tool_stats"]["malformed"] == 1, depth
        assert env.step("\\boxed{1}")[2] is True
        env.close()


def test_lone_surrogate_tool_name_through_an_episode_and_the_writer(tiny_tokenizer, tmp_path):
    # {"name": "\ud83d"} reached the tool message; write_jsonl then raised UnicodeEncodeError
    policy = ScriptedPolicy(tiny_tokenizer, max_new_tokens=512)
    mgr = episode_manager(tiny_tokenizer, policy)
    turns = ['<tool_call>{"name": "\\ud83d", "arguments": {"code": "print(\\"\\udc00\\")"}}</tool_call>']
    policy.start(turns)
    traj = asyncio.run(check_episode(mgr, 0, tmp_path / "t.jsonl"))
    assert traj.outcome == Outcome.OK and traj.info["tool_stats"]["unknown_tool"] == 1
    back = next(read_jsonl(tmp_path / "t.jsonl"))
    tool_msg = next(m for m in back.messages if m["role"] == "tool")
    assert tool_msg["name"] == "\ufffd" and "unknown tool" in tool_msg["content"]


def test_huge_exponent_final_answer_scores_zero_without_blocking_the_loop():
    # rule_reward spent 86 s in Fraction("1e30000000") on the event loop: no deadline could fire
    env = make_env()
    env.reset(seed=0)
    t0 = time.perf_counter()
    assert env.step("The answer is 1e30000000")[1] == 0.0
    assert time.perf_counter() - t0 < HANG_S
    env.close()


def test_hostile_text_generator_covers_the_families():
    rng = random.Random(0)
    texts = [hostile_text(rng, 2000) for _ in range(400)]
    assert all(len(t) <= 2000 for t in texts)
    joined = "".join(texts)
    for needle in (
        "<tool_call>",
        "\\boxed{",
        "[[[[",
        "\\ud83d",
        "\ud83d",
        "\x00",
        "\x1b[",
        "```python",
        "####",
        "1e",
        "\\frac{",
    ):
        assert needle in joined, needle
