"""Chat calls to API models (hosted, or any OpenAI-compatible endpoint) through litellm.

Owns: ``ApiClient`` — one model at one endpoint, ``await client.chat(messages, tools)`` ->
``ChatReply`` — with a per-call timeout, retries with exponential backoff and jitter on transient
failures (connection errors, timeouts, 408/409/429/5xx), a concurrency limit shared by every client
of the same model and endpoint in the process, and key hygiene:

* agentrl never holds an API key: litellm reads the provider's variable (``OPENAI_API_KEY``,
  ``ANTHROPIC_API_KEY``...) from the environment, or the client reads the variable named by
  ``api_key_env`` at call time and hands it straight to litellm;
* every message that leaves this module (errors) passes through ``redact``, which replaces the
  value of every secret-looking environment variable, and ``public_url`` drops credentials and
  query strings from endpoint URLs before they are recorded anywhere.

Failures raise ``EngineError`` (the API model is the engine of an API episode; callers that use it
for something else, like the judge, re-raise their own error type).

Does not: build prompts, parse tool calls or scores, or run episodes (``agentrl.envs.judge``,
``agentrl.jobs.eval``).
"""
from __future__ import annotations

import asyncio
import os
import random
import re
import weakref
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentrl.errors import ConfigError, EngineError

# litellm downloads a model price map at import unless told to use its bundled copy (no network is needed or wanted).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(_ID)?$|SECRET", re.IGNORECASE)
_RETRY_STATUS = {408, 409, 429}
_LIMITS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, asyncio.Semaphore]]" = \
    weakref.WeakKeyDictionary()


def secret_values() -> list[str]:
    """Values of environment variables whose names look secret (``*_API_KEY``, ``*_TOKEN``,
    ``*SECRET*``, ``*_PASSWORD``...), longest first; values under 8 characters are ignored."""
    vals = {v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= 8}
    return sorted(vals, key=len, reverse=True)


def without_secrets(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: this process's environment) without secret-looking variables:
    for child processes that need no API key (SGLang servers)."""
    return {k: v for k, v in (os.environ if env is None else env).items() if not _SECRET_NAME.search(k)}


def redact(text: str) -> str:
    """``text`` with every secret-looking environment value replaced by ``[redacted]``."""
    for v in secret_values():
        if v in text:
            text = text.replace(v, "[redacted]")
    return text


def public_url(url: str | None) -> str | None:
    """``url`` without user:password and query string (both can carry credentials)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _litellm():
    import litellm

    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banners on stdout
    return litellm


@dataclass
class ChatReply:
    """One completion: ``tool_calls`` as ``{"id", "name", "arguments"}`` (arguments: the raw JSON
    string the model wrote); ``finish_reason`` as the API says it (``stop``, ``length``, ``tool_calls``)."""

    content: str
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: dict = field(default_factory=dict)


class ApiClient:
    """One API model. ``model`` is litellm's ``provider/name`` (``openai/gpt-4o-mini``,
    ``anthropic/claude-...``, ``openai/<served name>`` with ``api_base`` for a local OpenAI-compatible
    server). ``sampling`` is passed to every call (``temperature``, ``top_p``, ``stop``, ``seed``...).

    ``timeout_s`` bounds one HTTP call; ``max_retries`` transient failures are retried, waiting
    ``backoff_s * 2**attempt`` (x0.5-1.5 jitter, at most 60 s); ``concurrency`` calls at most are in
    flight per (model, api_base) in this process, whatever the number of clients.
    """

    def __init__(self, model: str, *, api_base: str | None = None, api_key_env: str | None = None,
                 timeout_s: float = 120.0, max_retries: int = 3, backoff_s: float = 1.0, concurrency: int = 16,
                 sampling: dict[str, Any] | None = None) -> None:
        if not isinstance(model, str) or "/" not in model.strip("/"):
            raise ConfigError(f"model must be litellm's 'provider/name' (e.g. openai/gpt-4o-mini), got {model!r}")
        try:
            _litellm().get_llm_provider(model, api_base=api_base)
        except Exception as e:
            raise ConfigError(f"model {model!r}: litellm does not know its provider ({redact(str(e)).strip()[:200]})") from None
        if api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):
            raise ConfigError(f"api_key_env must name an environment variable, got {api_key_env!r}")
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ConfigError(f"timeout_s must be a number > 0, got {timeout_s!r}")
        if not isinstance(backoff_s, (int, float)) or not backoff_s >= 0:
            raise ConfigError(f"backoff_s must be a number >= 0, got {backoff_s!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"concurrency must be an int >= 1, got {concurrency!r}")
        reserved = {"model", "messages", "tools", "api_key", "api_base", "timeout", "num_retries"} & set(sampling or {})
        if reserved:
            raise ConfigError(f"sampling may not set {sorted(reserved)} (they are ApiClient arguments)")
        self.model, self.api_base, self.api_key_env = model, api_base, api_key_env
        self.timeout_s, self.max_retries, self.backoff_s = float(timeout_s), max_retries, float(backoff_s)
        self.concurrency = concurrency
        self.sampling = dict(sampling or {})

    def __repr__(self) -> str:  # never shows a key: it holds none
        return f"ApiClient({self.model!r}, api_base={public_url(self.api_base)!r})"

    def describe(self) -> dict:
        """What may be written beside results: model, endpoint without credentials, sampling."""
        return {"model": self.model, "api_base": public_url(self.api_base), "sampling": self.sampling}

    def _limit(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()  # asyncio primitives are bound to one loop
        per_loop = _LIMITS.setdefault(loop, {})
        key = (self.model, self.api_base, self.concurrency)
        if key not in per_loop:
            per_loop[key] = asyncio.Semaphore(self.concurrency)
        return per_loop[key]

    async def chat(self, messages: list[dict], tools: list[dict] | None = None, **overrides: Any) -> ChatReply:
        """One completion, retried on transient failures; EngineError (redacted) when it cannot be had."""
        litellm = _litellm()
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "timeout": self.timeout_s,
                                  "num_retries": 0, **self.sampling, **overrides}
        if tools:
            kwargs["tools"] = tools
            # litellm 1.106 imports its MCP gateway (and the optional `mcp` package) whenever tools are
            # passed; we never use MCP tools, and without `mcp` installed the call would fail.
            kwargs["_skip_mcp_handler"] = True
        if self.api_base:
            kwargs["api_base"] = self.api_base
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(60.0, self.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
                await asyncio.sleep(delay)
            if self.api_key_env:
                kwargs["api_key"] = os.environ.get(self.api_key_env, "")
            try:
                async with self._limit():
                    resp = await asyncio.wait_for(litellm.acompletion(**kwargs), self.timeout_s + 5.0)
            except (asyncio.TimeoutError, TimeoutError):
                last = TimeoutError(f"no answer within {self.timeout_s:g} s")
                continue
            except Exception as e:
                last = e
                if _transient(e):
                    continue
                break
            finally:
                kwargs.pop("api_key", None)
            return _reply(resp)
        assert last is not None
        tries = f"after {attempt + 1} attempt(s)"
        raise EngineError(redact(f"{self.model} at {public_url(self.api_base) or 'its default endpoint'} failed "
                                 f"{tries}: {type(last).__name__}: {last}"[:2000])) from None


def _transient(e: Exception) -> bool:
    status = getattr(e, "status_code", None)
    if isinstance(status, int):
        return status in _RETRY_STATUS or status >= 500
    litellm = _litellm()
    return isinstance(e, (litellm.exceptions.APIConnectionError, litellm.exceptions.Timeout, ConnectionError))


def _reply(resp: Any) -> ChatReply:
    try:
        choice = resp.choices[0]
        msg = choice.message
    except (AttributeError, IndexError, TypeError):
        raise EngineError(f"the API answered without a choice: {redact(str(resp))[:300]}") from None
    calls = []
    for i, c in enumerate(getattr(msg, "tool_calls", None) or []):
        fn = getattr(c, "function", None)
        calls.append({"id": getattr(c, "id", None) or f"call_{i}", "name": getattr(fn, "name", "") or "",
                      "arguments": getattr(fn, "arguments", "") or ""})
    usage = getattr(resp, "usage", None)
    return ChatReply(content=getattr(msg, "content", None) or "", tool_calls=calls,
                     finish_reason=str(getattr(choice, "finish_reason", None) or "stop"),
                     usage={"prompt_tokens": int(getattr(usage, "prompt_tokens", 0) or 0),
                            "completion_tokens": int(getattr(usage, "completion_tokens", 0) or 0)})
