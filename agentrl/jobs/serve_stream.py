"""Token-by-token streaming for `agentrl serve`: the text of a growing token list, released as
deltas that never have to be taken back, and the chunks of a streamed choice.

Owns :class:`TextDeltas` — decodes the tokens sampled so far, holds back an incomplete UTF-8
character and any tail that could still grow into a stop string or a held marker (``<tool_call>``:
the call is parsed whole once the reply ends), and notices a stop string (the caller then cancels
the generation) — and the chunk shapes of ``chat.completion.chunk`` / ``text_completion`` streams
(:func:`chunk`, :func:`message_deltas`).

Does not: run the engine, parse tool calls, or speak HTTP (:mod:`agentrl.jobs.serve_api`,
:mod:`agentrl.jobs.serve_app`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any


def _partial_tail(text: str, markers: list[str]) -> int:
    """Length of the longest end of ``text`` that is a proper prefix of one of ``markers``."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


class TextDeltas:
    """The decoded text of a growing list of sampled tokens, released as safe deltas.

    ``push(token)`` returns the text that can be sent now; ``finish()`` the rest once sampling
    ended. ``stopped`` turns True when a stop string appeared (``text`` is cut before it; nothing
    after it is released); ``held`` when a held marker appeared (nothing from it on is released:
    the caller handles the rest of ``text`` itself)."""

    def __init__(
        self, decode: Callable[[list[int]], str], stops: list[str], hold: list[str] = (), prefix: str = ""
    ) -> None:
        self.decode, self.stops, self.hold, self.prefix = decode, list(stops), list(hold), prefix
        self.ids: list[int] = []
        self.text = prefix
        self.sent = 0
        self.stopped = self.held = False

    def push(self, token: int) -> str:
        self.ids.append(token)
        if self.stopped:
            return ""
        new = self.decode(self.ids)
        if new.endswith("\ufffd"):  # the token ends inside a UTF-8 character: wait for the rest
            return ""
        return self._release(new, final=False)

    def finish(self) -> str:
        return "" if self.stopped else self._release(self.decode(self.ids), final=True)

    def _release(self, generated: str, final: bool) -> str:
        hits = [i for i in (generated.find(s) for s in self.stops) if i != -1]
        if hits:  # stop strings apply to sampled text only, never to the forced prefix
            generated, self.stopped = generated[: min(hits)], True
        self.text = self.prefix + generated
        if self.held:
            return ""
        end = len(self.text)
        marks = [i for i in (self.text.find(m) for m in self.hold) if i != -1]
        if marks:
            end, self.held = min(marks), True
        elif not final and not self.stopped:
            end -= _partial_tail(self.text, self.stops + self.hold)
        end = max(end, self.sent)
        out, self.sent = self.text[self.sent : end], end
        return out

    @property
    def rest(self) -> str:
        """Text not released (after a held marker)."""
        return self.text[self.sent :]


def chunk(
    head: dict,
    index: int,
    *,
    chat: bool,
    delta: dict | None = None,
    text: str = "",
    finish: str | None = None,
    logprobs: Any = None,
    extra: dict | None = None,
) -> dict:
    """One streamed chunk of choice ``index`` (``head``: id, object, created, model)."""
    c: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": logprobs}
    if chat:
        c["delta"] = delta or {}
    else:
        c["text"] = text
    if extra is not None:
        c["agentrl"] = extra
    return {**head, "choices": [c]}


def message_deltas(message: dict) -> list[dict]:
    """A finished assistant message as the deltas of a stream: the role and content, then each tool
    call whole (id, name and arguments in one delta, as clients accumulate them)."""
    out: list[dict] = [{"role": "assistant", "content": message.get("content") or ""}]
    for k, tc in enumerate(message.get("tool_calls") or []):
        out.append({"tool_calls": [{"index": k, **tc}]})
    return out


async def replay(response: dict, include_usage: bool) -> AsyncIterator[dict]:
    """A finished chat response (a constrained reply, checked before anything is sent) as stream chunks."""
    head = {k: response[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    for c in response["choices"]:
        for k, delta in enumerate(message_deltas(c["message"])):
            yield chunk(head, c["index"], chat=True, delta=delta, logprobs=c.get("logprobs") if k == 0 else None)
        yield chunk(head, c["index"], chat=True, finish=c["finish_reason"], extra=c["agentrl"])
    if include_usage:
        yield {**head, "choices": [], "usage": response["usage"], "agentrl": response["agentrl"]}
