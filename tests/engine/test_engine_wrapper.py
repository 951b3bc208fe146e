"""EngineWrapper: the Engine seam and every other attribute reach the inner engine; a subclass
that changes ``generate`` changes streaming too."""

import pickle

import pytest

from agentrl.engine.base import SamplingParams
from agentrl.engine.fake import FakeEngine
from agentrl.engine.wrapper import EngineWrapper

PARAMS = SamplingParams(max_new_tokens=4)


def _inner() -> FakeEngine:
    eng = FakeEngine(lambda ids, params, ctx: [7, 8, 9], max_context=64)
    eng.only_here = "extra"  # not part of the seam: reached through __getattr__
    return eng


async def test_the_seam_is_forwarded():
    inner = _inner()
    w = EngineWrapper(inner)
    await w.start()
    assert (await w.generate([1, 2], PARAMS, session="s")).token_ids == [7, 8, 9]
    assert inner.calls == 1
    await w.update_weights({}, 3)
    assert inner.loaded == [3] and w.policy_version == 3
    assert w.max_context == 64
    assert w.only_here == "extra"
    with pytest.raises(AttributeError):
        _ = w.not_anywhere
    await w.close()


class Doubling(EngineWrapper):
    """Changes only ``generate``: every sampled id is doubled."""

    async def generate(self, prompt_ids, params, *, session=None):
        g = await self.inner.generate(prompt_ids, params, session=session)
        g.token_ids = [2 * t for t in g.token_ids]
        return g


async def test_streaming_goes_through_the_subclass_generate():
    seen = []
    g = await Doubling(_inner()).generate_streaming([1], PARAMS, lambda t, lp: seen.append(t))
    assert g.token_ids == seen == [14, 16, 18]


def test_a_half_built_wrapper_does_not_recurse():
    w = EngineWrapper.__new__(EngineWrapper)  # as unpickling does: no __init__, no ``inner``
    with pytest.raises(AttributeError):
        _ = w.inner
    with pytest.raises(AttributeError):
        _ = w.pause


def test_a_wrapper_pickles_with_its_inner_engine():
    w = pickle.loads(pickle.dumps(EngineWrapper(FakeEngine(_fixed_policy))))
    assert isinstance(w.inner, FakeEngine) and w.max_context is None


def _fixed_policy(ids, params, ctx):
    return [5]
