"""`agentrl serve`: the OpenAI-compatible debug server as a command (registered on the main app by agentrl.cli.main).

Owns the command's arguments, choosing the backend and printing where it listens; everything it
runs is :mod:`agentrl.jobs.serve`.

``-c/--set`` give the run config's fields a served model shares with a run: ``output_dir`` (served
when no PATH is given: the run's newest checkpoint), else ``model.path``; ``engine.kind`` (the
backend), ``model.device`` and ``model.dtype``; ``model.chat_template`` and ``model.tool_prompt`` (how
chats are rendered: a served run's own unless the config names them). A flag or PATH wins over the
config, a field the config names wins over this command's default.
"""

from __future__ import annotations

import asyncio
import signal

import typer
from rich.console import Console

from agentrl.cli.errors import fail
from agentrl.cli.options import ConfigOpt, SetOpt, load, named, pick
from agentrl.errors import AgentRLError

console = Console()
BACKENDS = ("auto", "local", "sglang")


def serve_cmd(
    path: str | None = typer.Argument(
        None,
        help="HF model dir, GGUF file, a checkpoint (RUN/checkpoints/step_N) or a run dir (its newest checkpoint); "
        "default: the config's output_dir, else model.path.",
    ),
    port: int = typer.Option(8000, "--port", "-p", help="Port to listen on (0: pick a free one)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; there is no authentication, keep it local."),
    backend: str | None = typer.Option(
        None,
        "--backend",
        "-b",
        help="local | sglang | auto: sglang when installed, else local "
        "(default: engine.kind when the config names it, else auto).",
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Watch the run for newer complete checkpoints and hot-swap them."
    ),
    name: str | None = typer.Option(None, "--name", help="Served model name; default: the run's or model dir's name."),
    device: str | None = typer.Option(
        None, "--device", help="local backend: auto, cpu, cuda, cuda:1 (model.device; default auto: cuda if present)."
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", help="local backend: auto, float32, bfloat16, float16 (model.dtype; auto: bf16 on cuda)."
    ),
    poll_s: float = typer.Option(2.0, "--poll-s", help="--follow: seconds between looks for a new checkpoint."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="local backend: log every request."),
    config: list[str] | None = ConfigOpt,
    sets: list[str] | None = SetOpt,
) -> None:
    """Serve a model OpenAI-compatibly (/v1/models, /v1/chat/completions, /v1/completions) for debugging.

    Responses carry the sampled token ids, their logprobs and the policy version in an extra
    `agentrl` field; the local backend streams token by token and honours tool_choice and
    response_format. Point any OpenAI client at http://HOST:PORT/v1 (no key needed; litellm: model
    "openai/NAME", api_base=http://HOST:PORT/v1; agentrl eval --api-base http://HOST:PORT/v1).
    The local backend also speaks Anthropic Messages (/v1/messages: the anthropic client with
    base_url=http://HOST:PORT) and OpenAI Responses (/v1/responses, previous_response_id kept for
    the last 4096 responses)."""
    try:
        path, backend, device, dtype = settings(config, sets, path, backend, device, dtype)
        chat = chat_settings(config, sets)
    except AgentRLError as e:
        fail(e)
    # SIGTERM ends the server like Ctrl-C does, so a supervised SGLang server is never orphaned
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        _serve(path, port, host, backend, follow, name, device, dtype, poll_s, verbose, chat)
    except AgentRLError as e:
        fail(e)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def _serve(path, port, host, backend, follow, name, device, dtype, poll_s, verbose, chat=None) -> None:
    from agentrl.jobs.serve import LocalServer, SGLangService, resolve_target  # lazy: keeps CLI start light

    if backend not in BACKENDS:
        raise AgentRLError(f"--backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        from agentrl.engine.sglang.server import unavailable_reason  # lazy: pulls in httpx

        backend = "local" if unavailable_reason() else "sglang"
    target = resolve_target(path, follow=follow)
    for key, value in (chat or {}).items():  # the config's, over a run's own
        setattr(target, key, value)
    from agentrl.models.local_dir import check_model_dir  # lazy: keeps CLI start light

    check_model_dir(target.model_dir, "serve")  # before a server starts on it
    say = lambda msg: console.print(msg, highlight=False)  # noqa: E731
    if backend == "sglang":
        if device != "auto" or dtype != "auto":
            console.print("[yellow]note:[/] --device/--dtype apply to the local backend only")
        service = SGLangService(target, host=host, port=port, name=name, follow=follow, poll_s=poll_s, log=say)
        say(f"starting SGLang on {target.model_dir} (log {service.server.log_path}) ...")
        try:
            service.start()
            _ready(service.url, service.name, target, "sglang", follow)
            asyncio.run(service.supervise())
        finally:
            service.stop()
        return
    from agentrl.models.device import choose, probe  # lazy: keeps CLI start light

    device, dtype = choose(device, dtype, probe().cuda, what="serve")  # auto: cuda + bf16 when present
    say(f"device: {device}, dtype {dtype}")
    server = LocalServer(
        target,
        host=host,
        port=port,
        name=name,
        device=device,
        dtype=dtype,
        follow=follow,
        poll_s=poll_s,
        verbose=verbose,
        log=say,
    )
    try:
        server.start()
        _ready(server.url, server.name, target, "local", follow)
        server.wait()
    finally:
        server.stop()


def settings(
    config: list[str] | None,
    sets: list[str] | None,
    path: str | None,
    backend: str | None,
    device: str | None,
    dtype: str | None,
) -> tuple[str, str, str, str]:
    """(path, backend, device, dtype): each flag when given, else the config field it names, else the
    default; ConfigError when neither PATH nor a config names what to serve."""
    cfg = load(config, sets)
    given = named(config, sets)
    path = pick(path, cfg, "output_dir", given) or pick(None, cfg, "model.path", given)
    if path is None:
        raise AgentRLError("serve needs something to serve: PATH, or a config naming output_dir (a run) or model.path")
    return (
        str(path),
        pick(backend, cfg, "engine.kind", given, "auto"),
        pick(device, cfg, "model.device", given, "auto"),
        pick(dtype, cfg, "model.dtype", given, "auto"),
    )


def chat_settings(config: list[str] | None, sets: list[str] | None) -> dict:
    """``model.chat_template`` / ``model.tool_prompt`` where the config names them ({field: value}): they
    win over a served run's own (``ServeTarget``); unnamed, a run's own or the defaults apply."""
    cfg = load(config, sets)
    given = named(config, sets)
    return {k: getattr(cfg.model, k) for k in ("chat_template", "tool_prompt") if f"model.{k}" in given}


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _ready(url: str, name: str, target, backend: str, follow: bool) -> None:
    what = f"{target.checkpoint} (policy version {target.version})" if target.checkpoint else str(target.model_dir)
    console.print(
        f"serving [bold]{name}[/] = {what} with the {backend} backend at {url}/v1"
        + (f"; following {target.run_dir}" if follow else ""),
        highlight=False,
    )
    console.print(
        f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
        f'-d \'{{"model": "{name}", "messages": [{{"role": "user", "content": "hi"}}]}}\'',
        highlight=False,
        soft_wrap=True,
    )
