"""The plain fields of an OpenAI request body to `agentrl serve`, read and checked.

Owns: numbers in range (``num``), ``stop`` strings and ``stop_token_ids``, fields refused rather
than ignored (penalties, ``logit_bias``, ``echo``, ``best_of``, ``suffix``), ``stream_options``,
cutting text at a stop string, and turning an OpenAI message into what chat templates expect
(``template_message``). Every bad value is an :class:`~agentrl.serving.errors.APIError` naming
the field. Does not: decide tool use or the reply's format (:mod:`agentrl.serving.reply`).
"""

from __future__ import annotations

import json

from agentrl.serving.errors import APIError

#: most choices (``n``) one request may ask for
MAX_N = 16
_REFUSED = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
    "echo": False,
    "best_of": None,
    "suffix": None,
}


def num(body: dict, name: str, default, *, lo: float | None = None, hi: float | None = None, integer: bool = False):
    v = body.get(name)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        raise APIError(f"{name} must be {'an integer' if integer else 'a number'}, got {v!r}", param=name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise APIError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {v!r}", param=name)
    return v


def stop_strings(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise APIError(f"stop must be a non-empty string or a list of them, got {stop!r}", param="stop")
    return stops


def stop_token_ids(body: dict, vocab: int) -> list[int]:
    ids = body.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids
    ):
        raise APIError(
            f"stop_token_ids must be a list of token ids in [0, {vocab}), got {ids!r}", param="stop_token_ids"
        )
    return ids


def check_refused(body: dict) -> None:
    for name, neutral in _REFUSED.items():
        v = body.get(name)
        if v is not None and v != neutral and v != {}:
            raise APIError(f"{name}={v!r} is not supported by this server", param=name)


def include_usage(body: dict) -> bool:
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise APIError(f"stream_options must be an object, got {opts!r:.200}", param="stream_options")
    return bool((opts or {}).get("include_usage"))


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """``text`` cut before its first stop string, and that string (None: no stop string in it)."""
    hits = [(i, s) for s in stops if (i := text.find(s)) != -1]
    if not hits:
        return text, None
    at, stop = min(hits)
    return text[:at], stop


def template_message(message: dict) -> dict:
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
                    raise APIError(
                        f"tool call arguments are not JSON: {fn['arguments']!r:.200}", param="messages"
                    ) from e
            fixed.append({**c, "function": fn})
        m["tool_calls"] = fixed
    return m
