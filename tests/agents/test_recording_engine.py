"""RecordingEngine: the run's engine as the proxy's OpenAI app sees it (an EngineWrapper): it samples
only for a request's episode, and the run, not the endpoint, starts and closes the engine."""

import pytest

from agentrl.agents.proxy import RecordingEngine
from agentrl.engine.base import SamplingParams
from agentrl.engine.fake import FakeEngine
from agentrl.errors import EngineError


class Inner(FakeEngine):
    eos_token_ids = [2]
    closed = False

    async def close(self) -> None:
        self.closed = True


async def test_forwards_the_engine_but_neither_starts_nor_closes_it():
    inner = Inner(lambda ids, params, ctx: [7], max_context=64)
    rec = RecordingEngine(inner)
    await inner.update_weights({}, 3)
    assert (rec.policy_version, rec.max_context, rec.eos_token_ids) == (3, 64, [2])
    await rec.start()
    await rec.close()
    assert not inner.closed
    with pytest.raises(EngineError, match="outside an episode's request"):
        await rec.generate([1], SamplingParams(max_new_tokens=1))
    assert inner.calls == 0
