"""A scripted chat "model" for tests of the serve app's dialects and the recording proxy.

:class:`ScriptedChatEngine` is a FakeEngine whose reply is ``reply(prompt_text, call_index)`` (then
``<|im_end|>``), tokenized with the tiny tokenizer; it keeps every (prompt ids, Generation) it
returned in ``log``, so a test can hold what was recorded or answered against what was sampled.
:func:`tool_then_answer` calls the ``python`` tool until a tool answer is in the prompt.
:func:`served` runs an app (the serve app over any engine) on a loop of its own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from agentrl.engine.fake import FakeEngine

CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
TOOL_SCHEMA = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}


def tool_then_answer(prompt: str, call_index: int) -> str:
    if "<tool_response>" in prompt:
        return "The answer is 42."
    return "Let me compute it.\n" + CALL


class ScriptedChatEngine(FakeEngine):
    """A FakeEngine writing ``reply``'s text; ``log`` holds (prompt ids, Generation) of every call."""

    def __init__(self, tokenizer, reply=tool_then_answer) -> None:
        self.tokenizer, self.reply, self.log = tokenizer, reply, []
        super().__init__(self._policy, logprob=-0.25)

    def _policy(self, prompt_ids, params, ctx):
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        return self.tokenizer.encode(self.reply(text, ctx.call_index) + "<|im_end|>", add_special_tokens=False)

    async def generate(self, prompt_ids, params, *, session=None):
        g = await super().generate(prompt_ids, params, session=session)
        self.log.append((list(prompt_ids), g))
        return g


@contextlib.contextmanager
def served(app):
    """Serve ``app`` on 127.0.0.1 (a free port) from a loop in its own thread -> the base URL (no /v1)."""
    from agentrl.serving.app import HTTPServer

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    http = HTTPServer(app, "127.0.0.1", 0, loop).start()
    try:
        yield f"http://127.0.0.1:{http.port}"
    finally:
        http.stop()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
