"""Stop strings (``SamplingParams.stop``): the record, the SGLang payload, and LocalEngine keeping
exactly the sampled ids up to the token that completed the string. The same behaviour on a live
SGLang server is checked by the engine conformance suite (``test_stop_strings_end_at_the_token``)."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.engine.base import SamplingParams
from agentrl.engine.local.engine import LocalEngine
from agentrl.engine.sglang.wire import sampling_params, to_generation
from agentrl.errors import EngineError

pytestmark = pytest.mark.timeout(300)

PROMPT = [1, 872, 198, 40, 1079, 264, 1296, 13]
NEVER = (2051,)  # an explicit stop id instead of eos, so only the stop string (or the length) ends a request


def expected_cut(tokenizer, ids: list[int], stop: str) -> int | None:
    """The index of the first token after which the decoded ids hold ``stop`` (None: never)."""
    for j in range(len(ids)):
        if stop in tokenizer.decode(ids[: j + 1]):
            return j
    return None


def straddling(tokenizer, ids: list[int], k: int) -> str:
    """A string made of the end of token k-1's text and the start of token k's: it needs both."""
    before, upto = tokenizer.decode(ids[:k]), tokenizer.decode(ids[: k + 1])
    return upto[max(0, len(before) - 3) : len(before) + 2]


def test_sampling_params_stop_field():
    assert SamplingParams(stop=["</answer>", "</tool_call>"]).stop == ("</answer>", "</tool_call>")
    assert SamplingParams().stop == ()
    with pytest.raises(ValueError, match="the string '</a>'"):
        SamplingParams(stop="</a>")
    with pytest.raises(ValueError, match="non-empty"):
        SamplingParams(stop=("</a>", ""))


def test_sglang_payload_and_answer_with_a_stop_string():
    sp = sampling_params(SamplingParams(stop=("</answer>",), stop_token_ids=(2,)), 16)
    assert sp["stop"] == ["</answer>"] and sp["stop_token_ids"] == [2] and sp["no_stop_trim"] is True
    assert "stop" not in sampling_params(SamplingParams(), 16)
    answer = {
        "output_ids": [5, 6, 7],
        "meta_info": {
            "output_token_logprobs": [[-0.5, 5, None], [-0.1, 6, None], [-0.2, 7, None]],
            "finish_reason": {"type": "stop", "matched": "</a>"},
        },
    }
    gen = to_generation(answer, "http://x", 3)
    assert gen.token_ids == [5, 6, 7] and gen.finish_reason == "stop" and gen.versions == [3, 3, 3]
    empty = {
        "output_ids": [],
        "meta_info": {"output_token_logprobs": [], "finish_reason": {"type": "stop", "matched": "</a>"}},
    }
    with pytest.raises(EngineError, match="stopped on the string '</a>' but sent no output_ids"):
        to_generation(empty, "http://x", 0)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


async def test_local_engine_keeps_the_ids_up_to_the_completing_token(tiny_model_dir, tok):
    """Seeded sampling is reproducible per request, so the run with a stop string must be the run
    without it cut right after the first token whose text completes the string: same ids, same
    logprobs, finish "stop". The strings straddle two tokens (the tail window must hold both)."""
    eng = LocalEngine.from_pretrained(tiny_model_dir)
    try:
        ref_params = SamplingParams(max_new_tokens=40, temperature=1.0, seed=11, stop_token_ids=NEVER)
        ref = await eng.generate(PROMPT, ref_params)
        assert len(ref.token_ids) >= 30, "the reference must be long enough to cut"
        checked = 0
        for k in (5, 12, 25):
            stop = straddling(tok, ref.token_ids, k)
            j = expected_cut(tok, ref.token_ids, stop)
            assert j is not None and j <= k
            gen = await eng.generate(
                PROMPT,
                SamplingParams(
                    max_new_tokens=40, temperature=1.0, seed=11, stop_token_ids=NEVER, stop=("never-seen-@@", stop)
                ),
            )
            assert gen.finish_reason == "stop", (stop, gen.token_ids)
            assert gen.token_ids == ref.token_ids[: j + 1]
            assert gen.logprobs == ref.logprobs[: j + 1]
            assert stop in tok.decode(gen.token_ids) and stop not in tok.decode(gen.token_ids[:-1])
            checked += 1
        assert checked == 3
        miss = await eng.generate(
            PROMPT,
            SamplingParams(max_new_tokens=40, temperature=1.0, seed=11, stop_token_ids=NEVER, stop=("never-seen-@@",)),
        )
        assert miss.token_ids == ref.token_ids and miss.finish_reason == ref.finish_reason
    finally:
        await eng.close()


async def test_local_engine_streams_the_cut_tokens(tiny_model_dir, tok):
    eng = LocalEngine.from_pretrained(tiny_model_dir)
    try:
        ref = await eng.generate(PROMPT, SamplingParams(max_new_tokens=20, seed=3, stop_token_ids=NEVER))
        stop = straddling(tok, ref.token_ids, 8)
        seen: list[int] = []
        gen = await eng.generate_streaming(
            PROMPT,
            SamplingParams(max_new_tokens=20, seed=3, stop_token_ids=NEVER, stop=(stop,)),
            lambda t, lp: seen.append(t),
        )
        assert seen == gen.token_ids == ref.token_ids[: expected_cut(tok, ref.token_ids, stop) + 1]
    finally:
        await eng.close()


async def test_local_engine_without_a_tokenizer_refuses_stop_strings(tiny_model_dir, tok):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    eng = LocalEngine(model, device="cpu")
    try:
        with pytest.raises(EngineError, match="pass tokenizer= to LocalEngine"):
            await eng.generate(PROMPT, SamplingParams(max_new_tokens=4, stop=("x",)))
        plain = await eng.generate(PROMPT, SamplingParams(max_new_tokens=4, stop_token_ids=NEVER))
        assert len(plain.token_ids) == 4  # requests without stop strings need no tokenizer
    finally:
        await eng.close()
    eng = LocalEngine(model, device="cpu", tokenizer=tok)
    try:
        ref = await eng.generate(PROMPT, SamplingParams(max_new_tokens=12, seed=5, stop_token_ids=NEVER))
        stop = tok.decode(ref.token_ids)[-2:]
        gen = await eng.generate(PROMPT, SamplingParams(max_new_tokens=12, seed=5, stop_token_ids=NEVER, stop=(stop,)))
        cut = expected_cut(tok, ref.token_ids, stop)
        assert gen.finish_reason == "stop" and gen.token_ids == ref.token_ids[: cut + 1]
    finally:
        await eng.close()
