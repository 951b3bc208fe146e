"""Token-by-token streaming for `agentrl serve`: the choices of one request sampled concurrently
and sent as server-sent chunks while they are sampled.

Owns :func:`stream_choices` (each token's text sent as soon as it is safe, a choice cut at a stop
string cancelled there, a held tool call parsed and sent whole at the end, the usage chunk last);
:class:`TextDeltas`, which decodes the tokens sampled so far and holds back an incomplete UTF-8
character and any tail that could still grow into a stop string or a held marker (``<tool_call>``);
:class:`Job` (one choice to sample); and the chunk shapes of ``chat.completion.chunk`` /
``text_completion`` streams (:func:`chunk`, :func:`message_deltas`, :func:`replay`).

Does not: validate requests or parse tool calls (:mod:`agentrl.serving.api`,
:mod:`agentrl.serving.reply`), or speak HTTP (:mod:`agentrl.serving.app`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from agentrl.engine.base import Generation, SamplingParams
from agentrl.errors import EngineError
from agentrl.serving.errors import APIError
from agentrl.serving.reply import ReplyPlan, build_message
from agentrl.tools.calls import OPEN


@dataclasses.dataclass
class Job:
    """One choice to sample: its index in the response, prompt and sampling parameters."""

    index: int
    prompt: list[int]
    params: SamplingParams


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
    after it is released; ``matched`` is that string); ``held`` when a held marker appeared
    (nothing from it on is released: the caller handles the rest of ``text`` itself)."""

    def __init__(
        self, decode: Callable[[list[int]], str], stops: Sequence[str], hold: Sequence[str] = (), prefix: str = ""
    ) -> None:
        self.decode, self.stops, self.hold, self.prefix = decode, list(stops), list(hold), prefix
        self.ids: list[int] = []
        self.text = prefix
        self.sent = 0
        self.stopped = self.held = False
        self.matched: str | None = None

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
        hits = [(i, s) for s in self.stops if (i := generated.find(s)) != -1]
        if hits:  # stop strings apply to sampled text only, never to the forced prefix
            at, self.matched = min(hits)
            generated, self.stopped = generated[:at], True
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


async def replay(response: dict, include_usage: bool) -> AsyncGenerator[dict, None]:
    """A finished chat response (a constrained reply, checked before anything is sent) as stream chunks."""
    head = {k: response[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    for c in response["choices"]:
        for k, delta in enumerate(message_deltas(c["message"])):
            yield chunk(head, c["index"], chat=True, delta=delta, logprobs=c.get("logprobs") if k == 0 else None)
        yield chunk(head, c["index"], chat=True, finish=c["finish_reason"], extra=c["agentrl"])
    if include_usage:
        yield {**head, "choices": [], "usage": response["usage"], "agentrl": response["agentrl"]}


async def stream_choices(
    api,
    head: dict,
    jobs: list[Job],
    prompts: list[list[int]],
    decode: Callable[[list[int]], str],
    stops: list[str],
    logprobs: bool,
    include_usage: bool,
    *,
    plan: ReplyPlan | None,
) -> AsyncGenerator[dict, None]:
    """Chunks of ``jobs`` as their tokens are sampled (chat when ``plan`` is given, else text), by
    ``api`` (an :class:`~agentrl.serving.api.OpenAIAPI`): usage last with ``include_usage``."""
    chat = plan is not None
    head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
    queue: asyncio.Queue = asyncio.Queue()
    hold = [OPEN] if chat and plan.parse_tools else []
    texts = {job.index: TextDeltas(decode, stops, hold) for job in jobs}
    sampled: dict[int, tuple[list[int], list[float]]] = {job.index: ([], []) for job in jobs}
    shown = dict.fromkeys(texts, 0)  # tokens whose logprobs were sent
    offsets = dict.fromkeys(texts, 0)  # characters sent (completions' text_offset)
    gens: dict[int, Generation] = {}
    by_index = {job.index: job for job in jobs}
    tasks = {job.index: asyncio.create_task(_feed(api.engine, job, queue)) for job in jobs}

    def piece(i: int, text: str, finish: str | None = None, extra: dict | None = None) -> dict:
        ids, lps = sampled[i]
        lp = None
        if logprobs and shown[i] < len(ids):
            a, shown[i] = shown[i], len(ids)
            lp = (
                {"content": api.chat_logprobs(ids[a:], lps[a:])}
                if chat
                else api.text_logprobs(ids[a:], lps[a:], offsets[i])
            )
        offsets[i] += len(text)
        return chunk(
            head,
            i,
            chat=chat,
            delta={"content": text} if chat and text else None,
            text=text,
            finish=finish,
            logprobs=lp,
            extra=extra,
        )

    try:
        if chat:
            for i in texts:
                yield chunk(head, i, chat=True, delta={"role": "assistant", "content": ""})
        while len(gens) < len(jobs):
            kind, i, payload = await queue.get()
            if i in gens:
                continue  # tokens of a choice already cut at a stop string
            if kind == "error":
                yield APIError(f"the engine failed: {payload}", status=503, kind="engine_error").body()
                return
            deltas = texts[i]
            if kind == "token":
                sampled[i][0].append(payload[0])
                sampled[i][1].append(payload[1])
                text = deltas.push(payload[0])
                if text:
                    yield piece(i, text)
                if not deltas.stopped:
                    continue
                tasks[i].cancel()  # a stop string: no need to sample further
                ids, lps = sampled[i]
                g = Generation(list(ids), list(lps), "stop", [api.engine.policy_version] * len(ids))
            else:
                g = payload
                text = deltas.finish()
                if text:
                    yield piece(i, text)
            gens[i] = g
            finish = "stop" if deltas.stopped else g.finish_reason
            if chat and deltas.held:
                message, finish, _ = build_message(plan, deltas.text, finish)
                if message.get("tool_calls"):
                    for d in message_deltas(message)[1:]:
                        yield chunk(head, i, chat=True, delta=d)
                elif deltas.rest:
                    yield piece(i, deltas.rest)
            yield piece(i, "", finish=finish, extra=api.choice_extra(by_index[i].prompt, g, deltas.matched))
        if include_usage:
            yield {
                **head,
                "choices": [],
                "usage": api.usage(prompts, list(gens.values())),
                "agentrl": api.meta(),
            }
    finally:
        for t in tasks.values():
            t.cancel()


async def _feed(engine, job: Job, queue: asyncio.Queue) -> None:
    def on_token(token: int, logprob: float) -> None:
        queue.put_nowait(("token", job.index, (token, logprob)))

    try:
        g = await engine.generate_streaming(job.prompt, job.params, on_token)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # EngineError, or a bug: the stream must end with an error, not hang
        queue.put_nowait(("error", job.index, f"{type(e).__name__}: {e}" if not isinstance(e, EngineError) else e))
        return
    queue.put_nowait(("done", job.index, g))
