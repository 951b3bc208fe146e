"""The HTTP side of `agentrl serve`'s local backend: a FastAPI app served by uvicorn.

Owns: the routes (``/health``, ``/v1/health`` and every ``/v1/...`` path, handed to
:class:`agentrl.serving.api.OpenAIAPI`), reading request bodies (size limit, JSON), answering
errors as error bodies in the shape of the path's dialect (OpenAI's, or Anthropic's on
``/v1/messages``: an :class:`~agentrl.serving.errors.APIError`, an unknown path or method, a
bug: 500 naming it), streams as server-sent events (sse-starlette: ``data: {chunk}`` lines, then
``data: [DONE]``; the other dialects' streams name each event ``event: {type}`` and end without
``[DONE]``, as their APIs do; a client that goes away cancels its generation), and
:class:`HTTPServer`, which runs uvicorn on an asyncio loop the caller owns (the one its engine
runs on) on a socket bound up front (port 0 picks a free one; a busy port fails at once).

Why FastAPI/uvicorn rather than the standard library: streaming needs chunked responses, keep-alive
and disconnect handling that a hand-written ``http.server`` handler would have to re-implement.

Does not: validate request fields or run the engine (:mod:`agentrl.serving.api`), load models
or follow checkpoints (:mod:`agentrl.jobs.serve`).
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures' annotations.
import asyncio
import functools
import json
import time
from collections.abc import AsyncGenerator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException

from agentrl.common.ports import listening_socket
from agentrl.errors import ConfigError
from agentrl.serving.errors import APIError

MAX_BODY = 32 << 20


def build_app(api, *, health: Callable[[], dict] | None = None) -> FastAPI:
    """The FastAPI app answering ``api`` (an :class:`~agentrl.serving.api.OpenAIAPI`)."""
    app = FastAPI(title="agentrl serve", docs_url=None, redoc_url=None, openapi_url=None)
    health = health or api.meta

    def error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(api.error_body(request.url.path, e), status_code=e.status)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return error(request, e)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException):  # routing: unknown method on a path
        return error(request, APIError(f"{request.method} {request.url.path}: {e.detail}", status=e.status_code))

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception):  # a bug must still answer, not hang the client
        return error(request, _internal(e))

    @app.get("/health")
    @app.get("/v1/health")
    async def _health():
        return {"status": "ok", **health()}

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def _v1(path: str, request: Request):
        body = await _read_json(request) if request.method == "POST" else None
        result = await api.handle(request.method, "/" + path, body)
        if isinstance(result, dict):
            return JSONResponse(result)
        named = api.named_events(request.url.path)
        errors = functools.partial(api.error_body, request.url.path)
        return EventSourceResponse(_events(result, errors, named), ping=15)

    return app


async def _read_json(request) -> object:
    size = request.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > MAX_BODY):
        raise APIError(
            f"request body of {size} bytes is over the {MAX_BODY}-byte limit"
            if size.isdigit()
            else f"bad Content-Length header {size!r}",
            status=413 if size.isdigit() else 400,
        )
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise APIError(f"request body of {len(raw)} bytes is over the {MAX_BODY}-byte limit", status=413)
    try:
        return json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(f"the request body is not valid JSON: {e}") from e


def _internal(e: Exception) -> APIError:
    return APIError(f"internal error: {type(e).__name__}: {e}", status=500, kind="internal_error")


async def _events(
    chunks: AsyncGenerator[dict, None], errors: Callable[[APIError], dict], named: bool
) -> AsyncGenerator[dict, None]:
    """Stream chunks as SSE ``data:`` events, ``[DONE]`` last (``named``: each event named by its
    ``type``, no ``[DONE]``); a bug mid-stream ends it with an error event (``errors`` shapes it)."""

    def event(c: dict) -> dict:
        return {"event": c.get("type", "error"), "data": json.dumps(c)} if named else {"data": json.dumps(c)}

    try:
        async for c in chunks:
            yield event(c)
    except APIError as e:
        yield event(errors(e))
    except Exception as e:  # noqa: BLE001 - the client must see it; the response has started
        yield event(errors(_internal(e)))
    finally:
        await chunks.aclose()
    if not named:
        yield {"data": "[DONE]"}


class HTTPServer:
    """uvicorn serving ``app`` on ``loop`` (running in another thread) at ``host:port``."""

    def __init__(self, app, host: str, port: int, loop: asyncio.AbstractEventLoop, *, verbose: bool = False) -> None:
        self.app, self.host, self.loop, self.verbose = app, host, loop, verbose
        self.port = port
        self._server = None
        self._done = None

    def start(self, timeout_s: float = 30.0) -> "HTTPServer":
        import uvicorn

        try:  # bound and listening before anyone learns the port (port 0: the OS picks): no race for it
            sock = listening_socket(self.host, self.port)
        except OSError as e:
            raise ConfigError(f"serve: cannot listen on {self.host}:{self.port}: {e}") from e
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_level="info" if self.verbose else "warning",
            access_log=self.verbose,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._done = asyncio.run_coroutine_threadsafe(self._server.serve(sockets=[sock]), self.loop)
        end = time.monotonic() + timeout_s
        while not self._server.started:
            if self._done.done():
                self._done.result()  # raises what stopped it
                raise ConfigError(f"serve: the HTTP server on {self.host}:{self.port} stopped at start")
            if time.monotonic() > end:
                raise ConfigError(f"serve: the HTTP server on {self.host}:{self.port} did not start in {timeout_s:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._server is None or self._done is None:  # set together by start()
            return
        self._server.should_exit = True
        try:
            self._done.result(timeout_s)
        except Exception:  # noqa: BLE001 - stopping: nothing left to serve the error to
            pass
        self._server = None
