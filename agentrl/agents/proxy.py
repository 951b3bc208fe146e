"""The recording endpoint: outside agent loops sample from the policy through it.

It speaks what the serve app speaks: OpenAI chat completions (``/v1/chat/completions``), Anthropic
Messages (``/v1/messages``) and OpenAI Responses (``/v1/responses``); every dialect reaches the
engine through the app's one chat core, so what follows holds for all three.

Owns: :class:`ProxyEndpoint` (one HTTP server per run on 127.0.0.1, port 0, started on the run's
event loop; per-episode API keys mapped to :class:`EpisodeLink`), the ASGI wrapper that resolves a
request's key (``Authorization: Bearer KEY`` or Anthropic's ``x-api-key: KEY``), :class:`EpisodeGate`,
the app's per-request checks (401 for an unknown key; 400 for what the proxy cannot record
faithfully: ``n`` > 1; ``tool_choice`` other than auto/none and ``response_format``, which the
server would meet by forcing and re-sampling replies: off-policy; and each episode's own store of
Responses, so a ``previous_response_id`` resolves only within its episode), and :class:`RecordingEngine`,
the Engine the OpenAI app samples through (an ``EngineWrapper`` of the run's engine): it finds the
request's episode, builds the exact prompt, applies the run's sampling settings and budgets, and
records every completion in the episode's :class:`~agentrl.agents.recorder.Recorder`.

The exact prompt: when the request's messages extend the current segment's conversation (its last
request + the reply it got, compared with ``recorder.message_key``), the prompt is the segment's ids
plus the render delta of the new messages (``ChatRenderer.observation_ids``, the built-in loop's
method): sampled turns are never re-tokenized. Otherwise the app's own rendering of the messages is
the prompt; the recorder continues the segment if those ids extend it, else splits.

The request handling itself (validation, dialects, chat template, tool-call parsing, streaming) is
the serve app's (:mod:`agentrl.serving`, one layer below this package), built here over the
:class:`RecordingEngine` with an :class:`EpisodeGate`.

Does not: run agent programs or decide outcomes (:mod:`agentrl.agents.strategy`).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.agents.recorder import Recorder, covered
from agentrl.common.ports import listening_socket
from agentrl.engine.base import Engine, Generation, SamplingParams
from agentrl.engine.wrapper import EngineWrapper
from agentrl.episodes.chat import ChatRenderer
from agentrl.errors import ConfigError, EngineError, TemplateError
from agentrl.serving.api import OpenAIAPI
from agentrl.tools.calls import parse_hermes


@dataclass
class Budget:
    """The run's rollout limits and sampling settings, applied to every proxied completion."""

    max_turns: int
    max_new_tokens: int
    max_context: int
    min_turn_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...] = ()
    turn_timeout_s: float = 300.0


@dataclass
class EpisodeLink:
    """One running episode as the endpoint sees it: its recorder, budget and what stopped it."""

    session: str
    tokenizer: Any
    budget: Budget
    seed: int | None = None
    recorder: Recorder = field(default_factory=Recorder)
    splits: int = 0
    delta_prompts: int = 0
    stopped: tuple[str, str] | None = None  # (outcome value, detail) once a limit ended the episode
    last_text: str = ""
    responses: dict = field(default_factory=dict)  # OpenAI Responses of this episode, by id
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _renderers: dict = field(default_factory=dict)
    _tools_key: str | None = None

    def renderer(self, tools: list | None) -> ChatRenderer:
        key = json.dumps(tools or [], sort_keys=True)
        if key not in self._renderers:
            self._renderers[key] = ChatRenderer(self.tokenizer, tools=tools or None)
        return self._renderers[key]

    def exact_prompt(self, rendered: list[int], request: Request) -> list[int]:
        """The segment's ids + the render delta of the new messages when the request extends the
        segment's conversation with plain-text messages; else ``rendered``."""
        seg = self.recorder.current
        tools_key = json.dumps(request.tools or [], sort_keys=True)
        if seg is None or request.messages is None or tools_key != self._tools_key:
            return rendered
        n = covered(seg.messages, request.messages)
        new = request.messages[n:] if n is not None else []
        if not new or not all(isinstance(m.get("content"), str) and not m.get("tool_calls") for m in new):
            return rendered
        r = self.renderer(request.tools)
        try:
            delta = r.observation_ids(
                [{k: v for k, v in m.items() if k in ("role", "content", "name", "tool_call_id")} for m in new]
            )
            if seg.ids[-1] != r.end_of_turn_id:
                delta = r.close_ids([]) + delta
        except TemplateError:
            return rendered
        self.delta_prompts += 1
        return seg.ids + delta

    def reply(self, ids: list[int], tools: list | None, parse_tools: bool) -> tuple[dict, str]:
        """The assistant message the app returns for ``ids`` (as the serve app builds it) and its text."""
        text = self.renderer(None).decode(ids)
        if not parse_tools:
            return {"role": "assistant", "content": text}, text
        parsed = parse_hermes(text)
        calls = [
            {"type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in parsed.calls
        ]
        return {
            "role": "assistant",
            "content": (parsed.content or None) if calls else text,
            **({"tool_calls": calls} if calls else {}),
        }, text

    def stop(self, outcome: str, detail: str) -> EngineError:
        self.stopped = self.stopped or (outcome, detail)
        return EngineError(detail)

    async def generate(
        self, inner: Engine, rendered: list[int], params: SamplingParams, request: Request, on_token: Callable | None
    ) -> Generation:
        b = self.budget
        async with self.lock:
            if self.stopped:
                raise EngineError(f"the episode has ended: {self.stopped[1]}")
            if self.recorder.requests >= b.max_turns:
                raise self.stop("truncated_turns", f"reached max_turns={b.max_turns}")
            prompt = self.exact_prompt(rendered, request)
            room = b.max_context - len(prompt)
            if room < b.min_turn_tokens:
                raise self.stop("context_overflow", f"{len(prompt)} tokens leave {room} < min_turn_tokens")
            k = self.recorder.requests
            params = replace(
                params,
                max_new_tokens=min(params.max_new_tokens, b.max_new_tokens, room),
                temperature=b.temperature,
                top_p=b.top_p,
                top_k=b.top_k,
                stop=tuple(dict.fromkeys([*params.stop, *b.stop])),
                seed=None if self.seed is None else (self.seed + 7919 * k) % (2**31),
            )
            t0 = time.perf_counter()
            async with asyncio.timeout(b.turn_timeout_s):
                if on_token is None:
                    gen = await inner.generate(prompt, params, session=self.session)
                else:
                    gen = await inner.generate_streaming(prompt, params, on_token, session=self.session)
            if (
                not gen.token_ids
                or len(gen.logprobs) != len(gen.token_ids)
                or (gen.versions and len(gen.versions) != len(gen.token_ids))
            ):
                raise EngineError(f"engine returned {len(gen.token_ids)} ids but {len(gen.logprobs)} logprobs")
            versions = gen.versions or [inner.policy_version] * len(gen.token_ids)
            reply, self.last_text = self.reply(gen.token_ids, request.tools, request.parse_tools)
            kind = self.recorder.record(
                prompt,
                gen.token_ids,
                gen.logprobs,
                versions,
                gen.finish_reason,
                gen_s=time.perf_counter() - t0,
                messages=request.messages,
                reply=reply,
                tools=request.tools,
            )
            self._tools_key = json.dumps(request.tools or [], sort_keys=True)
            self.splits += kind == "split"
            return gen


@dataclass
class Request:
    """What the engine needs of the HTTP request it samples for (the chat form, set by the gate)."""

    link: EpisodeLink | None
    messages: list[dict] | None = None
    tools: list | None = None
    parse_tools: bool = False


_current: contextvars.ContextVar[Request | None] = contextvars.ContextVar("agentrl_proxy_request", default=None)


class RecordingEngine(EngineWrapper):
    """The Engine the OpenAI app calls: each call is sampled and recorded for the request's episode.
    The rest is the run's engine's (``policy_version``, ``max_context``, ``eos_token_ids``, ...),
    which the run starts and closes: the endpoint only samples through it."""

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def _request(self) -> Request:
        req = _current.get()
        if req is None or req.link is None:
            raise EngineError("a proxied completion arrived outside an episode's request")
        return req

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session: str | None = None
    ) -> Generation:
        req = self._request()
        return await req.link.generate(self.inner, list(prompt_ids), params, req, None)

    async def generate_streaming(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        on_token: Callable[[int, float], None],
        *,
        session: str | None = None,
    ) -> Generation:
        req = self._request()
        return await req.link.generate(self.inner, list(prompt_ids), params, req, on_token)


def refusal(body: Any) -> str | None:
    """Why the proxy refuses a chat request it could not record as the policy's own samples, or None."""
    if not isinstance(body, dict):
        return None  # the app answers malformed bodies itself
    if body.get("n") not in (None, 1):
        return f"n={body.get('n')!r}: the recording proxy samples one choice per request"
    if body.get("tool_choice") not in (None, "auto", "none"):
        return (
            f"tool_choice={body.get('tool_choice')!r}: the server would force and re-sample the reply, "
            "which is not the policy's own sample; use 'auto' or 'none' in training"
        )
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        return f"response_format={fmt!r}: forced and re-sampled replies cannot be trained on; leave it unset"
    return None


class EpisodeGate:
    """The serve app's gate (``agentrl.serving.api.Gate``) on the recording endpoint: the
    request's episode, set by :class:`KeyedApp`, decides."""

    def authorize(self) -> str | None:
        req = _current.get()
        if req is None or req.link is None:
            return (
                "unknown or expired API key: each episode has its own (OPENAI_API_KEY / ANTHROPIC_API_KEY "
                "in the agent program's environment)"
            )
        return None

    def admit(self, chat: dict) -> str | None:
        """Refuse what cannot be recorded; else note the chat form the engine records with."""
        why = refusal(chat)
        req = _current.get()
        if why or req is None:
            return why
        tools = chat.get("tools")
        req.messages = chat.get("messages") if isinstance(chat.get("messages"), list) else None
        req.tools = tools if isinstance(tools, list) else None
        req.parse_tools = bool(tools) and chat.get("tool_choice") != "none"
        return None

    def responses(self) -> dict:
        return _current.get().link.responses


def _key(scope) -> str:
    headers = dict(scope.get("headers") or [])
    auth = headers.get(b"authorization", b"").decode("latin-1")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get(b"x-api-key", b"").decode("latin-1").strip()


class KeyedApp:
    """ASGI wrapper: the request's API key -> its episode's link (None: unknown), set for the gate and
    the engine to find."""

    def __init__(self, app: Any, links: dict[str, EpisodeLink]) -> None:
        self.app, self.links = app, links

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        token = _current.set(Request(self.links.get(_key(scope))))
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)


class ProxyEndpoint:
    """The run's recording endpoint: started once on the running loop, then shared by its episodes.
    ``model_name``: the name the app answers to; ``max_tokens``: a request's default ``max_tokens``
    (``rollout.max_new_tokens``)."""

    def __init__(self, model_name: str, *, max_tokens: int) -> None:
        self.model_name, self.max_tokens = model_name, max_tokens
        self.links: dict[str, EpisodeLink] = {}
        self.url: str | None = None
        self._server = None
        self._task: asyncio.Task | None = None
        self._engine: Engine | None = None
        self._lock = asyncio.Lock()

    async def start(self, engine: Engine, tokenizer: Any, timeout_s: float = 30.0) -> str:
        """Serve ``engine`` (idempotent; one engine per endpoint) -> the base URL (``.../v1``)."""
        async with self._lock:
            if self._engine is not None:
                if engine is not self._engine:
                    raise ConfigError("one proxy endpoint serves one engine; build one endpoint per engine")
                return self.url  # type: ignore[return-value]
            import uvicorn

            # here, not at the top: FastAPI (as uvicorn) loads only when an endpoint starts
            from agentrl.serving.app import build_app

            api = OpenAIAPI(
                RecordingEngine(engine),
                tokenizer,
                self.model_name,
                default_max_tokens=self.max_tokens,
                gate=EpisodeGate(),
            )
            app = KeyedApp(build_app(api), self.links)
            sock = listening_socket("127.0.0.1", 0)  # the OS picks a port, already ours: no race for it
            port = sock.getsockname()[1]
            self._server = uvicorn.Server(
                uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=2)
            )
            self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
            end = time.monotonic() + timeout_s
            while not self._server.started:
                if self._task.done():
                    self._task.result()
                    raise EngineError("the agent proxy's HTTP server stopped at start")
                if time.monotonic() > end:
                    raise EngineError(f"the agent proxy's HTTP server did not start in {timeout_s:g} s")
                await asyncio.sleep(0.01)
            self._engine, self.url = engine, f"http://127.0.0.1:{port}/v1"
            return self.url

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 10)
        except (Exception, asyncio.CancelledError):  # noqa: BLE001 - stopping: nothing left to serve
            self._task.cancel()
        self._server = self._task = self._engine = None
