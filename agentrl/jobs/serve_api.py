"""OpenAI-compatible requests answered by an agentrl Engine (the `agentrl serve` local backend).

Owns: validating ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions`` request bodies
(a bad value is an :class:`APIError` naming the field and the value: HTTP 4xx), rendering chats
with the model's own chat template (:mod:`agentrl.episodes.chat`), running the engine, and building the
response dicts: text, ``usage``, tool calls (Hermes ``<tool_call>`` blocks when the request
declares ``tools``), OpenAI-style logprobs on request, and — always — an ``agentrl`` field per
choice with the exact sampled ``token_ids``, their behaviour ``logprobs``, the ``prompt_token_ids``
and the policy version that sampled them (for debugging RL).

Semantics worth knowing:

- ``stop`` strings are applied to the decoded text after generation (the engine stops on token ids
  only): the text is cut at the first stop string and ``finish_reason`` is "stop", while the
  ``agentrl.token_ids`` still list every sampled token. ``stop_token_ids`` (an extension, as in
  vLLM/SGLang) stop the engine itself.
- ``stream: true`` is answered as server-sent events carrying the whole completion in one chunk
  once generation ends (the engine does not stream tokens): clients that insist on streaming work,
  nothing arrives early.
- Only the sampled token's logprob exists: ``top_logprobs`` > 0 (chat) or ``logprobs`` > 0
  (completions) is refused with 400; penalties and ``logit_bias`` are refused, not ignored.

Does not: speak HTTP (``agentrl.jobs.serve``), load models or follow checkpoints.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Callable

from agentrl.episodes.chat import ChatRenderer, render
from agentrl.engine.base import Engine, Generation, SamplingParams
from agentrl.errors import EngineError, TemplateError
from agentrl.tools.calls import parse_hermes

MAX_N = 16
_REFUSED = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None, "echo": False, "best_of": None,
            "suffix": None}


class APIError(Exception):
    """A request the server answers with ``status`` and an OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}


def _num(body: dict, name: str, default, *, lo: float | None = None, hi: float | None = None, integer: bool = False):
    v = body.get(name)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        raise APIError(f"{name} must be {'an integer' if integer else 'a number'}, got {v!r}", param=name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise APIError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {v!r}", param=name)
    return v


def _stop_strings(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise APIError(f"stop must be a non-empty string or a list of them, got {stop!r}", param="stop")
    return stops


def _stop_ids(body: dict, vocab: int) -> list[int]:
    ids = body.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids):
        raise APIError(f"stop_token_ids must be a list of token ids in [0, {vocab}), got {ids!r}", param="stop_token_ids")
    return ids


def _check_refused(body: dict) -> None:
    for name, neutral in _REFUSED.items():
        v = body.get(name)
        if v is not None and v != neutral and v != {}:
            raise APIError(f"{name}={v!r} is not supported by this server", param=name)


def _cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    hits = [i for i in (text.find(s) for s in stops) if i != -1]
    return (text[:min(hits)], True) if hits else (text, False)


class OpenAIAPI:
    """Answers OpenAI API bodies with ``engine``; ``tokenizer`` must be the served model's.

    ``model_name`` is the only model served (others get 404); ``weights`` returns a description of
    the weights loaded now (path, step) that goes into every response's ``agentrl`` field."""

    def __init__(self, engine: Engine, tokenizer: Any, model_name: str, *, default_max_tokens: int = 512,
                 weights: Callable[[], dict] | None = None) -> None:
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.default_max_tokens = default_max_tokens
        self.weights = weights or (lambda: {})
        self.renderer = ChatRenderer(tokenizer)
        self.vocab = len(tokenizer)
        self.created = int(time.time())

    # ------------------------------------------------------------------ endpoints
    async def handle(self, method: str, path: str, body: Any) -> dict:
        """Route one request; raises APIError for anything but a success."""
        path = path.split("?", 1)[0].rstrip("/")
        routes = {"/v1/models": ("GET", self.models), "/v1/chat/completions": ("POST", self.chat),
                  "/v1/completions": ("POST", self.completions)}
        if path not in routes:
            raise APIError(f"no route {path!r}; this server answers {sorted(routes)}", status=404, kind="not_found")
        want, fn = routes[path]
        if method != want:
            raise APIError(f"{path} takes {want}, got {method}", status=405)
        if want == "GET":
            return await fn()
        if not isinstance(body, dict):
            raise APIError(f"the request body must be a JSON object, got {type(body).__name__}")
        return await fn(body)

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "agentrl", "agentrl": self.meta()}]}

    async def chat(self, body: dict) -> dict:
        self._check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise APIError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}} objects, got {messages!r:.200}",
                           param="messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise APIError(f"tools must be a list, got {tools!r:.200}", param="tools")
        logprobs = bool(body.get("logprobs"))
        if _num(body, "top_logprobs", 0, lo=0, integer=True):
            raise APIError("top_logprobs > 0 is not supported: only the sampled token's logprob is known", param="top_logprobs")
        try:
            text = render(self.tokenizer, [_plain(m) for m in messages], tools=tools, add_generation_prompt=True)
        except TemplateError as e:
            raise APIError(f"cannot render messages with the model's chat template: {e}", param="messages") from e
        prompt = self.renderer.encode(text)
        stops = _stop_strings(body)
        stop_ids = tuple(dict.fromkeys([*self.renderer.stop_token_ids, *_stop_ids(body, self.vocab)]))
        gens = await self._generate(body, [prompt], stop_ids, key_tokens="max_completion_tokens")
        choices = []
        for i, g in enumerate(gens):
            content, cut = _cut_at_stop(self.renderer.decode(g.token_ids), stops)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            finish = "stop" if cut else g.finish_reason
            if tools:
                parsed = parse_hermes(content)
                if parsed.calls:
                    message["content"] = parsed.content or None
                    message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                        "name": c.name, "arguments": json.dumps(c.arguments)}} for c in parsed.calls]
                    finish = "tool_calls"
            choice = {"index": i, "message": message, "finish_reason": finish,
                      "agentrl": self._choice_extra(prompt, g)}
            if logprobs:
                choice["logprobs"] = {"content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                    for t, lp in self._token_strings(g)]}
            choices.append(choice)
        return self._response("chat.completion", "chatcmpl", choices, [prompt], gens)

    async def completions(self, body: dict) -> dict:
        self._check_model(body)
        prompts = self._prompts(body.get("prompt"))
        if _num(body, "logprobs", 0, lo=0, integer=True):
            raise APIError("logprobs > 0 is not supported: only the sampled token's logprob is known; use logprobs=0",
                           param="logprobs")
        want_logprobs = body.get("logprobs") is not None
        stops = _stop_strings(body)
        stop_ids = tuple(_stop_ids(body, self.vocab))  # () = the model's eos ids
        gens = await self._generate(body, prompts, stop_ids, key_tokens="max_tokens")
        n = len(gens) // len(prompts)
        choices = []
        for i, g in enumerate(gens):
            ids = [t for t in g.token_ids if t not in set(stop_ids or self.engine_eos())]
            text, cut = _cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), stops)
            choice = {"index": i, "text": text, "finish_reason": "stop" if cut else g.finish_reason,
                      "logprobs": None, "agentrl": self._choice_extra(prompts[i // n], g)}
            if want_logprobs:
                pairs = self._token_strings(g)
                offsets, at = [], 0
                for t, _ in pairs:
                    offsets.append(at)
                    at += len(t)
                choice["logprobs"] = {"tokens": [t for t, _ in pairs], "token_logprobs": [lp for _, lp in pairs],
                                      "top_logprobs": None, "text_offset": offsets}
            choices.append(choice)
        return self._response("text_completion", "cmpl", choices, prompts, gens)

    # ------------------------------------------------------------------ helpers
    def engine_eos(self) -> tuple[int, ...]:
        return tuple(getattr(self.engine, "eos_token_ids", ()) or ())

    def _check_model(self, body: dict) -> None:
        _check_refused(body)
        model = body.get("model", self.model_name)
        if model != self.model_name:
            raise APIError(f"model {model!r} is not served here; this server serves {self.model_name!r}",
                           status=404, param="model", kind="not_found")

    def _prompts(self, prompt: Any) -> list[list[int]]:
        bad = APIError(f"prompt must be a string, a list of strings, a list of token ids or a list of such lists, "
                       f"got {prompt!r:.200}", param="prompt")
        if isinstance(prompt, str):
            prompt = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
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

    async def _generate(self, body: dict, prompts: list[list[int]], stop_ids: tuple[int, ...], *,
                        key_tokens: str) -> list[Generation]:
        n = _num(body, "n", 1, lo=1, hi=MAX_N, integer=True)
        limit = self.engine.max_context
        longest = max(len(p) for p in prompts)
        if limit is not None and longest >= limit:
            raise APIError(f"the prompt has {longest} tokens; the model's context is {limit} tokens", param="messages"
                           if key_tokens == "max_completion_tokens" else "prompt")
        room = (limit - longest) if limit is not None else None
        default = min(self.default_max_tokens, room) if room is not None else self.default_max_tokens
        max_tokens = _num(body, key_tokens, None, lo=1, integer=True)
        max_tokens = _num(body, "max_tokens", default, lo=1, integer=True) if max_tokens is None else max_tokens
        top_k = _num(body, "top_k", 0, lo=-1, integer=True)
        seed = _num(body, "seed", None, integer=True)
        try:
            params = [SamplingParams(max_new_tokens=max_tokens, temperature=float(_num(body, "temperature", 1.0, lo=0, hi=2)),
                                     top_p=float(_num(body, "top_p", 1.0, lo=0, hi=1)), top_k=max(top_k, 0),
                                     stop_token_ids=stop_ids, seed=None if seed is None else seed + j)
                      for j in range(n)]
        except ValueError as e:
            raise APIError(str(e)) from e
        jobs = [self.engine.generate(p, sp) for p in prompts for sp in params]
        try:
            return list(await asyncio.gather(*jobs))
        except EngineError as e:
            raise APIError(f"the engine failed: {e}", status=503, kind="engine_error") from e

    def _token_strings(self, g: Generation) -> list[tuple[str, float]]:
        return [(self.tokenizer.decode([t], skip_special_tokens=False), lp) for t, lp in zip(g.token_ids, g.logprobs)]

    def _choice_extra(self, prompt: list[int], g: Generation) -> dict:
        return {"prompt_token_ids": prompt, "token_ids": g.token_ids, "logprobs": g.logprobs,
                "policy_versions": sorted(set(g.versions)), "engine_finish_reason": g.finish_reason}

    def meta(self) -> dict:
        """The policy version served now and where its weights came from."""
        return {"policy_version": self.engine.policy_version, **self.weights()}

    def _response(self, obj: str, prefix: str, choices: list[dict], prompts: list[list[int]], gens: list[Generation]) -> dict:
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(g.token_ids) for g in gens)
        return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": obj, "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens},
                "agentrl": self.meta()}


def _plain(message: dict) -> dict:
    """OpenAI message -> what chat templates expect: list-of-parts content joined to text,
    tool-call ``arguments`` JSON strings parsed to objects (Qwen's template writes them with tojson)."""
    m = dict(message)
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for p in content:
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise APIError(f"only text content parts are supported, got {p!r:.200}", param="messages")
            parts.append(p["text"])
        m["content"] = "".join(parts)
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for c in calls:
            fn = dict((c or {}).get("function") or {})
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except json.JSONDecodeError as e:
                    raise APIError(f"tool call arguments are not JSON: {fn['arguments']!r:.200}", param="messages") from e
            fixed.append({**c, "function": fn})
        m["tool_calls"] = fixed
    return m


def stream_events(response: dict, include_usage: bool = False) -> list[dict]:
    """A finished chat/completion response as the chunks of a stream (one content chunk, then the
    finish reason with the ``agentrl`` field, then usage if asked): what ``stream: true`` receives."""
    chat = response["object"] == "chat.completion"
    head = {k: response[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    events = []
    for c in response["choices"]:
        if chat:
            delta = {"role": "assistant", **{k: v for k, v in c["message"].items() if k != "role"}}
            if "tool_calls" in delta:
                delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(delta["tool_calls"])]
            first = {"index": c["index"], "delta": delta, "finish_reason": None, "logprobs": c.get("logprobs")}
            last = {"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"], "agentrl": c["agentrl"]}
        else:
            first = {"index": c["index"], "text": c["text"], "finish_reason": None, "logprobs": c.get("logprobs")}
            last = {"index": c["index"], "text": "", "finish_reason": c["finish_reason"], "agentrl": c["agentrl"]}
        events += [{**head, "choices": [first]}, {**head, "choices": [last]}]
    if include_usage:
        events.append({**head, "choices": [], "usage": response["usage"], "agentrl": response["agentrl"]})
    return events
