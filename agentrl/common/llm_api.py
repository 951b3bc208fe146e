"""Chat calls to API models (hosted, or any OpenAI-compatible endpoint) through litellm.

Owns: ``ApiClient`` — one model at one endpoint, ``await client.chat(messages, tools)`` ->
``ChatReply`` — with a per-call timeout, retries of transient failures only (tenacity, exponential
backoff with jitter; what is transient is decided by litellm's error classes: timeouts, connection
errors, 408/409/429 and 5xx — never authentication, permission, bad-request, not-found or
context-window errors), a concurrency limit shared by every client of the same model and endpoint
in the process, credentials checked before the first call, and key hygiene:

* agentrl never holds an API key: litellm reads the provider's variable (``OPENAI_API_KEY``,
  ``ANTHROPIC_API_KEY``...) from the environment, or the client reads the variable named by
  ``api_key_env`` at call time and hands it straight to litellm;
* credentials (:func:`credential_plan`, ``ApiClient.check_credentials``): a hosted model whose
  provider's key variable is unset is a ``ConfigError`` before the first call (``agentrl eval``
  checks before any episode; a call made anyway fails at once, not retried); an ``api_base`` on this machine
  (localhost, 127.x, ::1) gets a placeholder key — never the provider's real one, which belongs to
  the hosted service — unless ``api_key_env`` names one; a remote ``api_base`` of an
  OpenAI-compatible provider with no key set gets the placeholder too (such servers usually take
  any key);
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
import ipaddress
import os
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
#: the key sent to endpoints that need none (OpenAI-compatible clients refuse to call without one)
PLACEHOLDER_KEY = "agentrl-no-key"
#: litellm providers that speak the OpenAI API to whatever ``api_base`` says
_OPENAI_COMPATIBLE = {
    "openai",
    "text-completion-openai",
    "custom_openai",
    "hosted_vllm",
    "openai_like",
    "lm_studio",
    "llamafile",
    "vllm",
}
#: providers that authenticate from ambient credentials (cloud IAM roles, application default
#: credentials, a local daemon) that no single environment variable shows
_AMBIENT_AUTH = {
    "bedrock",
    "sagemaker",
    "sagemaker_chat",
    "vertex_ai",
    "vertex_ai_beta",
    "azure",
    "azure_ai",
    "ollama",
    "ollama_chat",
    "watsonx",
}
_CREDENTIAL_WORDS = ("missing credentials", "api_key", "api key", "unauthorized", "authentication")
_LIMITS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


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


def is_local_url(url: str | None) -> bool:
    """True for an endpoint on this machine (localhost, a loopback address, 0.0.0.0)."""
    host = (urlsplit(url).hostname or "") if url else ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return addr.is_loopback or addr.is_unspecified


def credential_plan(model: str, api_base: str | None, api_key_env: str | None) -> str:
    """How calls to ``model`` authenticate (see the module docstring): ``"env"`` (the variable
    ``api_key_env`` names), ``"provider"`` (litellm reads the provider's own variable or ambient
    credentials) or ``"placeholder"`` (:data:`PLACEHOLDER_KEY`). ConfigError, naming the variables
    to set, when a hosted model has no key. Never reads a key's value beyond "is it set"."""
    if api_key_env:
        if not os.environ.get(api_key_env):
            raise ConfigError(
                f"api_key_env={api_key_env!r} names an environment variable that is not set (or is empty)"
            )
        return "env"
    if api_base and is_local_url(api_base):
        return "placeholder"
    litellm = _litellm()
    provider = litellm.get_llm_provider(model, api_base=api_base)[1]
    missing = list(litellm.validate_environment(model, api_base=api_base).get("missing_keys") or [])
    if not missing or provider in _AMBIENT_AUTH:
        return "provider"
    if api_base and provider in _OPENAI_COMPATIBLE:
        return "placeholder"
    raise ConfigError(
        f"model {model!r} needs an API key: set {' / '.join(missing)} in the environment, or name the "
        f"variable that holds it with api_key_env (agentrl eval --api-key-env VAR)"
    )


def is_transient(e: BaseException) -> bool:
    """Whether a failed call may succeed if tried again: timeouts, connection errors, 408/409/429 and
    5xx are; authentication, permission, bad requests (context window included), unknown models, and
    a "server error" that is really a missing credential are not. The HTTP status litellm's error
    classes carry decides (litellm maps some 5xx of OpenAI-compatible servers to BadRequestError but
    keeps their status); without one, the class does."""
    if isinstance(e, (asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return True
    if any(w in str(e).lower() for w in _CREDENTIAL_WORDS):
        return False  # the OpenAI client's "Missing credentials" reaches us as a 500
    status = getattr(e, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status in _RETRY_STATUS or status >= 500
    ex = _litellm().exceptions
    return isinstance(
        e,
        (
            ex.Timeout,
            ex.APIConnectionError,
            ex.RateLimitError,
            ex.ServiceUnavailableError,
            ex.InternalServerError,
            ex.BadGatewayError,
        ),
    )


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

    ``timeout_s`` bounds one HTTP call; ``max_retries`` transient failures (:func:`is_transient`) are
    retried, waiting a random time up to ``backoff_s * 2**attempt`` (at most 60 s); ``concurrency``
    calls at most are in flight per (model, api_base) in this process, whatever the number of
    clients. Credentials are settled by :meth:`check_credentials` (before the first call).
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        concurrency: int = 16,
        sampling: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) or "/" not in model.strip("/"):
            raise ConfigError(f"model must be litellm's 'provider/name' (e.g. openai/gpt-4o-mini), got {model!r}")
        try:
            _litellm().get_llm_provider(model, api_base=api_base)
        except Exception as e:
            raise ConfigError(
                f"model {model!r}: litellm does not know its provider ({redact(str(e)).strip()[:200]})"
            ) from None
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
        self._credentials: str | None = None

    def check_credentials(self) -> str:
        """Settle how calls authenticate (:func:`credential_plan`): ConfigError naming the variable
        to set when a hosted model has no key. Callers that run many calls (``agentrl eval``) call it
        first, so a missing key is one error before any episode; ``chat`` calls it too."""
        if self._credentials is None:
            self._credentials = credential_plan(self.model, self.api_base, self.api_key_env)
        return self._credentials

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
        """One completion, transient failures retried; EngineError (redacted) when it cannot be had."""
        from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "timeout": self.timeout_s,
            "num_retries": 0,
            **self.sampling,
            **overrides,
        }
        if tools:
            kwargs["tools"] = tools
        if self.api_base:
            kwargs["api_base"] = self.api_base
        try:
            credentials = self.check_credentials()
        except ConfigError as e:
            raise EngineError(f"{self.model}: {e}") from None
        attempts = 0
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.max_retries + 1),
                reraise=True,
                wait=wait_random_exponential(multiplier=self.backoff_s, max=60.0),
                retry=retry_if_exception(is_transient),
            ):
                with attempt:
                    attempts += 1
                    return _reply(await self._call(kwargs, credentials))
        except Exception as e:
            retried = f"after {attempts} attempt(s)" + (
                "" if is_transient(e) else " (not a transient error: not retried)"
            )
            where = public_url(self.api_base) or "its default endpoint"
            raise EngineError(
                redact(f"{self.model} at {where} failed {retried}: {type(e).__name__}: {e}"[:2000])
            ) from None
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def _call(self, kwargs: dict[str, Any], credentials: str) -> Any:
        litellm = _litellm()
        call = dict(kwargs)
        if credentials == "env":
            call["api_key"] = os.environ.get(self.api_key_env or "", "")  # read now, dropped with `call`
        elif credentials == "placeholder":
            call["api_key"] = PLACEHOLDER_KEY
        async with self._limit():
            try:
                return await asyncio.wait_for(litellm.acompletion(**call), self.timeout_s + 5.0)
            except TimeoutError:
                raise TimeoutError(f"no answer within {self.timeout_s:g} s") from None


def _reply(resp: Any) -> ChatReply:
    try:
        choice = resp.choices[0]
        msg = choice.message
    except (AttributeError, IndexError, TypeError):
        raise EngineError(f"the API answered without a choice: {redact(str(resp))[:300]}") from None
    calls = []
    for i, c in enumerate(getattr(msg, "tool_calls", None) or []):
        fn = getattr(c, "function", None)
        calls.append(
            {
                "id": getattr(c, "id", None) or f"call_{i}",
                "name": getattr(fn, "name", "") or "",
                "arguments": getattr(fn, "arguments", "") or "",
            }
        )
    usage = getattr(resp, "usage", None)
    return ChatReply(
        content=getattr(msg, "content", None) or "",
        tool_calls=calls,
        finish_reason=str(getattr(choice, "finish_reason", None) or "stop"),
        usage={
            "prompt_tokens": int(getattr(usage, "prompt_tokens", 0) or 0),
            "completion_tokens": int(getattr(usage, "completion_tokens", 0) or 0),
        },
    )
