"""`agentrl serve`: the OpenAI-compatible debug server as a command (registered on the main app by agentrl.cli.main).

Owns the command's arguments, choosing the backend and printing where it listens; everything it
runs is :mod:`agentrl.jobs.serve`.
"""
from __future__ import annotations

import asyncio
import signal
from typing import Optional

import typer
from rich.console import Console

from agentrl.cli.errors import fail
from agentrl.errors import AgentRLError

console = Console()
BACKENDS = ("auto", "local", "sglang")


def serve_cmd(
    path: str = typer.Argument(..., help="HF model dir, a checkpoint (RUN/checkpoints/step_N) or a run dir (its newest checkpoint)."),
    port: int = typer.Option(8000, "--port", "-p", help="Port to listen on (0: pick a free one)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; there is no authentication, keep it local."),
    backend: str = typer.Option("auto", "--backend", "-b", help="local | sglang | auto (sglang when installed, else local)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Watch the run for newer complete checkpoints and hot-swap them."),
    name: Optional[str] = typer.Option(None, "--name", help="Served model name; default: the run's or model dir's name."),
    device: str = typer.Option("cpu", "--device", help="local backend: torch device (cpu, cuda, cuda:1)."),
    dtype: str = typer.Option("float32", "--dtype", help="local backend: torch dtype of the weights."),
    poll_s: float = typer.Option(2.0, "--poll-s", help="--follow: seconds between looks for a new checkpoint."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="local backend: log every request."),
) -> None:
    """Serve a model OpenAI-compatibly (/v1/models, /v1/chat/completions, /v1/completions) for debugging.

    Responses carry the sampled token ids, their logprobs and the policy version in an extra
    `agentrl` field. Point any OpenAI client at http://HOST:PORT/v1 (litellm: model
    "openai/NAME", api_base=http://HOST:PORT/v1)."""
    # SIGTERM ends the server like Ctrl-C does, so a supervised SGLang server is never orphaned
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        _serve(path, port, host, backend, follow, name, device, dtype, poll_s, verbose)
    except AgentRLError as e:
        fail(e)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def _serve(path, port, host, backend, follow, name, device, dtype, poll_s, verbose) -> None:
    from agentrl.jobs.serve import LocalServer, SGLangService, resolve_target

    if backend not in BACKENDS:
        raise AgentRLError(f"--backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        from agentrl.engine.sglang_server import unavailable_reason

        backend = "local" if unavailable_reason() else "sglang"
    target = resolve_target(path, follow=follow)
    from agentrl.models.local_dir import check_model_dir

    check_model_dir(target.model_dir, "serve")  # before a server starts on it
    say = lambda msg: console.print(msg, highlight=False)  # noqa: E731
    if backend == "sglang":
        if device != "cpu" or dtype != "float32":
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
    server = LocalServer(target, host=host, port=port, name=name, device=device, dtype=dtype, follow=follow,
                         poll_s=poll_s, verbose=verbose, log=say)
    try:
        server.start()
        _ready(server.url, server.name, target, "local", follow)
        server.wait()
    finally:
        server.stop()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _ready(url: str, name: str, target, backend: str, follow: bool) -> None:
    what = f"{target.checkpoint} (policy version {target.version})" if target.checkpoint else str(target.model_dir)
    console.print(f"serving [bold]{name}[/] = {what} with the {backend} backend at {url}/v1"
                  + (f"; following {target.run_dir}" if follow else ""), highlight=False)
    console.print(f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
                  f"-d '{{\"model\": \"{name}\", \"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}]}}'",
                  highlight=False, soft_wrap=True)
