"""OpenAI-compatible requests answered by an agentrl Engine (the `agentrl serve` local backend).

Owns: routing, validating ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions`` request bodies
(a bad value is an :class:`APIError` naming the field and the value: HTTP 4xx), rendering chats
with the model's own chat template (:mod:`agentrl.episodes.chat`), running the engine, and building
the responses — whole, or streamed token by token — with text, ``usage``, tool calls (Hermes
``<tool_call>`` blocks, shaped by ``tool_choice`` as :mod:`agentrl.serving.reply` says),
OpenAI-style logprobs on request, and — always — an ``agentrl`` field per choice with the exact
sampled ``token_ids``, their behaviour ``logprobs``, the ``prompt_token_ids`` and the policy
version that sampled them (for debugging RL).

The chat handling (:meth:`OpenAIAPI.chat`) is the one request-handling core: the other dialects
(``/v1/messages``, ``/v1/responses``: :mod:`agentrl.serving.dialects`) are adapters that translate
their request to a chat body, call it, and translate its answer back. A server that embeds the app
(the recording proxy) hands in a :class:`Gate`: its per-request checks and its own store of
Responses.

Semantics worth knowing:

- ``stream: true`` sends each piece of text as soon as it is sampled (``chat.completion.chunk`` /
  ``text_completion`` chunks; usage last with ``stream_options.include_usage``). Text that could
  still become a stop string or a ``<tool_call>`` tag is held back until it is known; a tool call
  is sent whole once the reply ends. A reply that must pass a check (``tool_choice`` "required" or
  a named function, ``parallel_tool_calls=false`` with tools, ``response_format`` JSON) is checked
  before anything of it is sent, so it arrives in one piece.
- ``stop`` strings are applied to the decoded text (the engine stops on token ids only): the text
  is cut at the first stop string, ``finish_reason`` is "stop" and, when streaming, the generation
  is cancelled there; ``agentrl.token_ids`` list every sampled token. ``stop_token_ids`` (an
  extension, as in vLLM/SGLang) stop the engine itself.
- Only the sampled token's logprob exists: ``top_logprobs`` > 0 (chat) or ``logprobs`` > 0
  (completions) is refused with 400; penalties and ``logit_bias`` are refused, not ignored.

Does not: speak HTTP (:mod:`agentrl.serving.app`), load models or follow checkpoints.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
import uuid
from collections.abc import AsyncGenerator, Callable, MutableMapping
from typing import Any, Protocol

from agentrl.engine.base import Engine, Generation, SamplingParams
from agentrl.episodes.chat import ChatRenderer, render
from agentrl.errors import EngineError, TemplateError
from agentrl.serving.dialects import AnthropicMessages, OpenAIResponses, Reply, ResponseStore
from agentrl.serving.errors import APIError
from agentrl.serving.fields import (
    MAX_N,
    check_refused,
    cut_at_stop,
    include_usage,
    num,
    stop_strings,
    stop_token_ids,
    template_message,
)
from agentrl.serving.reply import MAX_ATTEMPTS, ReplyPlan, build_message, plan_reply
from agentrl.serving.stream import Job, replay, stream_choices

__all__ = ["APIError", "DIALECTS", "Gate", "OpenAIAPI", "MAX_N"]

#: the dialect adapters, by the path they answer
DIALECTS = {d.path: d for d in (AnthropicMessages, OpenAIResponses)}


class Gate(Protocol):
    """What a server embedding the app checks and keeps per request (the recording proxy: the
    episode a request's API key names)."""

    def authorize(self) -> str | None:
        """Why the request is refused (HTTP 401: no such key), or None; called first on every POST."""
        ...

    def admit(self, chat: dict) -> str | None:
        """Why this chat body (the core's form, whatever the dialect) is refused (HTTP 400), or None;
        called once it is valid, before anything is sampled."""
        ...

    def responses(self) -> MutableMapping:
        """Where this request's Responses are kept for ``previous_response_id``."""
        ...


class OpenAIAPI:
    """Answers OpenAI API bodies with ``engine``; ``tokenizer`` must be the served model's.

    ``model_name`` is the only model served (others get 404); ``weights`` returns a description of
    the weights loaded now (path, step) that goes into every response's ``agentrl`` field; ``gate``
    (see :class:`Gate`) is an embedding server's; without one every request is admitted and
    Responses are kept in the process (the last ``ResponseStore`` limit of them)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        model_name: str,
        *,
        default_max_tokens: int = 512,
        weights: Callable[[], dict] | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.default_max_tokens = default_max_tokens
        self.weights = weights or (lambda: {})
        self.renderer = ChatRenderer(tokenizer)
        self.vocab = len(tokenizer)
        self.created = int(time.time())
        self.gate = gate
        self.store = ResponseStore()

    # ------------------------------------------------------------------ endpoints
    async def handle(self, method: str, path: str, body: Any) -> dict | AsyncGenerator[dict, None]:
        """Route one request -> a response dict, or the chunks of a stream (``stream: true``; the
        request is fully validated before the iterator is returned). Raises APIError otherwise."""
        path = path.split("?", 1)[0].rstrip("/")
        routes = {
            "/v1/models": ("GET", self.models),
            "/v1/chat/completions": ("POST", self.chat),
            "/v1/completions": ("POST", self.completions),
            **{p: ("POST", functools.partial(self._dialect, p)) for p in DIALECTS},
        }
        if path not in routes:
            raise APIError(f"no route {path!r}; this server answers {sorted(routes)}", status=404, kind="not_found")
        want, fn = routes[path]
        if method != want:
            raise APIError(f"{path} takes {want}, got {method}", status=405)
        if want == "GET":
            return await fn()
        why = self.gate.authorize() if self.gate else None
        if why:
            raise APIError(why, status=401, kind="authentication_error")
        if not isinstance(body, dict):
            raise APIError(f"the request body must be a JSON object, got {type(body).__name__}")
        return await fn(body)

    async def _dialect(self, path: str, body: dict) -> dict | AsyncGenerator[dict, None]:
        """A dialect's request, answered by the chat core through its adapter."""
        store = self.gate.responses() if self.gate else self.store
        adapter = DIALECTS[path](body, self.model_name, store)
        result = await self.chat(adapter.chat())
        if isinstance(result, dict):
            return adapter.whole(Reply.of_response(result))
        return adapter.stream(result)

    @staticmethod
    def error_body(path: str, e: APIError) -> dict:
        """``e`` in the shape of the dialect ``path`` belongs to (OpenAI's by default)."""
        dialect = DIALECTS.get(path.split("?", 1)[0].rstrip("/"))
        return dialect.error_body(e) if dialect else e.body()

    @staticmethod
    def named_events(path: str) -> bool:
        """True when ``path``'s streams name each SSE event (its ``type``) and end without ``[DONE]``."""
        return path.split("?", 1)[0].rstrip("/") in DIALECTS

    async def models(self) -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "agentrl",
                    "agentrl": self.meta(),
                }
            ],
        }

    async def chat(self, body: dict) -> dict | AsyncGenerator[dict, None]:
        self._check_model(body)
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and "role" in m for m in messages)
        ):
            raise APIError(
                f"messages must be a non-empty list of {{'role': ..., 'content': ...}} objects, got {messages!r:.200}",
                param="messages",
            )
        plan = plan_reply(body)
        why = self.gate.admit(body) if self.gate else None
        if why:
            raise APIError(why)
        logprobs = bool(body.get("logprobs"))
        if num(body, "top_logprobs", 0, lo=0, integer=True):
            raise APIError(
                "top_logprobs > 0 is not supported: only the sampled token's logprob is known", param="top_logprobs"
            )
        try:
            text = render(
                self.tokenizer, [template_message(m) for m in messages], tools=plan.tools, add_generation_prompt=True
            )
        except TemplateError as e:
            raise APIError(f"cannot render messages with the model's chat template: {e}", param="messages") from e
        prompt = self.renderer.encode(text + plan.prefix)
        stops = stop_strings(body)
        stop_ids = tuple(dict.fromkeys([*self.renderer.stop_token_ids, *stop_token_ids(body, self.vocab)]))
        jobs = [
            Job(j, prompt, sp) for j, sp in enumerate(self._params(body, [prompt], stop_ids, "max_completion_tokens"))
        ]
        stream = bool(body.get("stream"))
        usage = include_usage(body) if stream else False
        head = self._head("chat.completion", "chatcmpl")
        if stream and not plan.constrained:
            return stream_choices(self, head, jobs, [prompt], self.renderer.decode, stops, logprobs, usage, plan=plan)
        results = await asyncio.gather(*(self._chat_choice(job, plan, stops, logprobs) for job in jobs))
        response = self._response(head, [c for c, _ in results], [prompt], [g for _, g in results])
        return replay(response, usage) if stream else response

    async def completions(self, body: dict) -> dict | AsyncGenerator[dict, None]:
        self._check_model(body)
        prompts = self._prompts(body.get("prompt"))
        if num(body, "logprobs", 0, lo=0, integer=True):
            raise APIError(
                "logprobs > 0 is not supported: only the sampled token's logprob is known; use logprobs=0",
                param="logprobs",
            )
        want_logprobs = body.get("logprobs") is not None
        stops = stop_strings(body)
        stop_ids = tuple(stop_token_ids(body, self.vocab))  # () = the model's eos ids
        params = self._params(body, prompts, stop_ids, "max_tokens")
        n = len(params)
        jobs = [Job(p * n + j, prompt, sp) for p, prompt in enumerate(prompts) for j, sp in enumerate(params)]
        drop = set(stop_ids or self.engine_eos())

        def decode(ids: list[int]) -> str:
            return self.tokenizer.decode([t for t in ids if t not in drop], skip_special_tokens=True)

        head = self._head("text_completion", "cmpl")
        if body.get("stream"):
            return stream_choices(
                self, head, jobs, prompts, decode, stops, want_logprobs, include_usage(body), plan=None
            )
        gens = await asyncio.gather(*(self._run(job.prompt, job.params) for job in jobs))
        choices = []
        for job, g in zip(jobs, gens):
            text, cut = cut_at_stop(decode(g.token_ids), stops)
            choice = {
                "index": job.index,
                "text": text,
                "finish_reason": "stop" if cut else g.finish_reason,
                "logprobs": None,
                "agentrl": self.choice_extra(job.prompt, g, cut),
            }
            if want_logprobs:
                choice["logprobs"] = self.text_logprobs(g.token_ids, g.logprobs, 0)
            choices.append(choice)
        return self._response(head, choices, prompts, gens)

    # ------------------------------------------------------------------ one choice, whole
    async def _chat_choice(
        self, job: Job, plan: ReplyPlan, stops: list[str], logprobs: bool
    ) -> tuple[dict, Generation]:
        """Sample one chat choice; a constrained plan re-samples a reply that fails its check."""
        attempts = MAX_ATTEMPTS if plan.constrained and job.params.temperature > 0 else 1
        for attempt in range(attempts):
            params = job.params
            if attempt and params.seed is not None:
                params = dataclasses.replace(params, seed=params.seed + 7919 * attempt)
            g = await self._run(job.prompt, params)
            text, cut = cut_at_stop(self.renderer.decode(g.token_ids), stops)
            message, finish, problem = build_message(plan, plan.prefix + text, "stop" if cut else g.finish_reason)
            if problem is None:
                break
        else:
            fields = " and ".join(plan.checked)
            raise APIError(
                f"{fields}: no reply of the model met the request in {attempts} attempt(s) (the server forces "
                f"the reply's start and samples again; last: {problem}; reply: {plan.prefix + text!r:.300})",
                status=422,
                param=plan.checked[0],
                kind="unmet_constraint",
            )
        choice = {
            "index": job.index,
            "message": message,
            "finish_reason": finish,
            "agentrl": self.choice_extra(job.prompt, g, cut),
        }
        if logprobs:
            choice["logprobs"] = {"content": self.chat_logprobs(g.token_ids, g.logprobs)}
        return choice, g

    # ------------------------------------------------------------------ helpers
    def engine_eos(self) -> tuple[int, ...]:
        return tuple(getattr(self.engine, "eos_token_ids", ()) or ())

    def _check_model(self, body: dict) -> None:
        check_refused(body)
        model = body.get("model", self.model_name)
        if model != self.model_name:
            raise APIError(
                f"model {model!r} is not served here; this server serves {self.model_name!r}",
                status=404,
                param="model",
                kind="not_found",
            )

    def _prompts(self, prompt: Any) -> list[list[int]]:
        bad = APIError(
            f"prompt must be a string, a list of strings, a list of token ids or a list of such lists, "
            f"got {prompt!r:.200}",
            param="prompt",
        )
        if isinstance(prompt, str):
            prompt = [prompt]
        elif (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise bad
        out = []
        for p in prompt:
            if isinstance(p, str):
                ids = list(self.tokenizer.encode(p, add_special_tokens=False))
            elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                if any(not 0 <= t < self.vocab for t in p):
                    raise APIError(f"prompt token ids must be in [0, {self.vocab}), got {p!r:.200}", param="prompt")
                ids = list(p)
            else:
                raise bad
            if not ids:
                raise APIError("prompt is empty: nothing to continue", param="prompt")
            out.append(ids)
        return out

    def _params(
        self, body: dict, prompts: list[list[int]], stop_ids: tuple[int, ...], key_tokens: str
    ) -> list[SamplingParams]:
        """The ``n`` sampling parameters of each prompt (seeds ``seed + j``)."""
        n = num(body, "n", 1, lo=1, hi=MAX_N, integer=True)
        limit = self.engine.max_context
        longest = max(len(p) for p in prompts)
        if limit is not None and longest >= limit:
            raise APIError(
                f"the prompt has {longest} tokens; the model's context is {limit} tokens",
                param="messages" if key_tokens == "max_completion_tokens" else "prompt",
            )
        room = (limit - longest) if limit is not None else None
        default = min(self.default_max_tokens, room) if room is not None else self.default_max_tokens
        max_tokens = num(body, key_tokens, None, lo=1, integer=True)
        max_tokens = num(body, "max_tokens", default, lo=1, integer=True) if max_tokens is None else max_tokens
        top_k = num(body, "top_k", 0, lo=-1, integer=True)
        seed = num(body, "seed", None, integer=True)
        try:
            return [
                SamplingParams(
                    max_new_tokens=max_tokens,
                    temperature=float(num(body, "temperature", 1.0, lo=0, hi=2)),
                    top_p=float(num(body, "top_p", 1.0, lo=0, hi=1)),
                    top_k=max(top_k, 0),
                    stop_token_ids=stop_ids,
                    seed=None if seed is None else seed + j,
                )
                for j in range(n)
            ]
        except ValueError as e:
            raise APIError(str(e)) from e

    async def _run(self, prompt: list[int], params: SamplingParams) -> Generation:
        try:
            return await self.engine.generate(prompt, params)
        except EngineError as e:
            raise APIError(f"the engine failed: {e}", status=503, kind="engine_error") from e

    def _token_strings(self, ids: list[int], lps: list[float]) -> list[tuple[str, float]]:
        return [(self.tokenizer.decode([t], skip_special_tokens=False), lp) for t, lp in zip(ids, lps)]

    def chat_logprobs(self, ids: list[int], lps: list[float]) -> list[dict]:
        return [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in self._token_strings(ids, lps)
        ]

    def text_logprobs(self, ids: list[int], lps: list[float], at: int) -> dict:
        pairs = self._token_strings(ids, lps)
        offsets = []
        for t, _ in pairs:
            offsets.append(at)
            at += len(t)
        return {
            "tokens": [t for t, _ in pairs],
            "token_logprobs": [lp for _, lp in pairs],
            "top_logprobs": None,
            "text_offset": offsets,
        }

    def choice_extra(self, prompt: list[int], g: Generation, stop: str | None = None) -> dict:
        """The ``agentrl`` field of a choice: the exact ids, their logprobs and versions, the
        engine's own finish reason and ``stop_string``, the stop string the text was cut at."""
        return {
            "prompt_token_ids": prompt,
            "token_ids": g.token_ids,
            "logprobs": g.logprobs,
            "policy_versions": sorted(set(g.versions)),
            "engine_finish_reason": g.finish_reason,
            "stop_string": stop,
        }

    def meta(self) -> dict:
        """The policy version served now and where its weights came from."""
        return {"policy_version": self.engine.policy_version, **self.weights()}

    def _head(self, obj: str, prefix: str) -> dict:
        return {
            "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
            "object": obj,
            "created": int(time.time()),
            "model": self.model_name,
        }

    @staticmethod
    def usage(prompts: list[list[int]], gens: list[Generation]) -> dict:
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(g.token_ids) for g in gens)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _response(self, head: dict, choices: list[dict], prompts: list[list[int]], gens: list[Generation]) -> dict:
        return {
            **head,
            "choices": sorted(choices, key=lambda c: c["index"]),
            "usage": self.usage(prompts, gens),
            "agentrl": self.meta(),
        }
