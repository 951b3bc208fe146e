"""`agentrl serve`: serve a model, a checkpoint or the policy of a run OpenAI-compatibly, for debugging.

Owns: turning PATH into the weights to load (:func:`resolve_target`: an HF model directory, a
checkpoint ``RUN/checkpoints/step_N/`` with its COMPLETE marker — itself an HF directory, see
:mod:`agentrl.trainer.checkpoint` — or a run directory, meaning its newest complete checkpoint);
following a run (:class:`CheckpointFollower` polls for newer complete checkpoints and hot-swaps the
weights, so the policy under training is what answers); and the two backends:

- ``local`` (:class:`LocalServer`): one asyncio loop (in a thread of its own) runs both the HTTP
  server (FastAPI + uvicorn, :mod:`agentrl.serving.app`) and an in-process
  :class:`~agentrl.engine.local.engine.LocalEngine` (which batches concurrent requests); requests are
  answered by :class:`agentrl.serving.api.OpenAIAPI` (OpenAI chat and completions, and through
  :mod:`agentrl.serving.dialects` Anthropic Messages and OpenAI Responses), streams token by token. Weight swaps go
  through ``LocalEngine.update_weights``.
- ``sglang`` (:class:`SGLangService`): launches ``sglang.launch_server`` on the weights through
  :mod:`agentrl.engine.sglang.server` (SGLang serves ``/v1`` itself), restarts it on the newest
  weights if it dies, and swaps weights with ``/update_weights_from_disk``.

Does not: authenticate (bind it to localhost), batch across servers, or write anything into the
run directory (it only reads checkpoints the trainer has finished).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agentrl.common.paths import cache_dir
from agentrl.episodes.tokenizer import load_chat_tokenizer, prepare, template_text
from agentrl.errors import AgentRLError, ConfigError, EngineError
from agentrl.models.gguf import find_gguf
from agentrl.models.hub import HubRef, parse_ref, resolve_model
from agentrl.serving.api import OpenAIAPI
from agentrl.warmstart.default_model import resolve_model_path

MARKER = "COMPLETE"  # agentrl.trainer.checkpoint.MARKER (not imported: that module pulls in torch.distributed)
_STEP = re.compile(r"step_(\d+)")


# ---------------------------------------------------------------------------------------- paths
@dataclass
class ServeTarget:
    """What to serve: ``model_dir`` is loaded now; ``run_dir`` is set when a run can be followed;
    ``chat_template`` and ``tool_prompt`` are the ``model.*`` values chats are rendered with (a run's
    own, when the target is in a run)."""

    model_dir: Path
    run_dir: Path | None = None
    checkpoint: Path | None = None
    version: int = 0
    chat_template: str | None = None
    tool_prompt: str = "auto"

    def describe(self) -> dict:
        return {"weights": str(self.model_dir), "checkpoint": self.checkpoint.name if self.checkpoint else None}


def checkpoint_step(ckpt: Path) -> int | None:
    """N for a directory named ``step_N``; None for anything else (``step_N.tmp`` being written and
    ``step_N.old`` being replaced carry a COMPLETE marker too, for a moment: never serve those)."""
    m = _STEP.fullmatch(Path(ckpt).name)
    return int(m.group(1)) if m else None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    done = [(checkpoint_step(m.parent), m.parent) for m in (Path(run_dir) / "checkpoints").glob(f"step_*/{MARKER}")]
    done = [(n, p) for n, p in done if n is not None]
    return max(done)[1] if done else None


def checkpoint_version(ckpt: Path) -> int:
    """The policy version a checkpoint's weights carry (``trainer_state.json``)."""
    try:
        return int(json.loads((ckpt / "trainer_state.json").read_text())["version"])
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"checkpoint {ckpt} has no readable trainer_state.json version: {e}") from e


def _run_initial_model(run_dir: Path) -> Path:
    import yaml

    cfg_file = run_dir / "config.yaml"
    try:
        model_path = ((yaml.safe_load(cfg_file.read_text()) or {}).get("model") or {}).get("path")
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(
            f"run directory {run_dir} has no checkpoint yet and its config.yaml cannot be read: {e}"
        ) from e
    return resolve_model_path(model_path)


def _run_chat(run: Path) -> dict:
    """The run's ``model.chat_template`` / ``model.tool_prompt`` (its ``config.yaml``), as far as it says."""
    import yaml

    try:
        model = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("model") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return {}
    return {k: model[k] for k in ("chat_template", "tool_prompt") if k in model}


def resolve_target(path: str | Path, *, follow: bool = False) -> ServeTarget:
    """PATH -> what to serve. ConfigError naming PATH when it is none of the accepted kinds.

    With ``follow``, PATH must be (in) a run: a run directory, or one of its checkpoints (the run
    is then followed from there). A run with no complete checkpoint yet serves the model it
    started from (its ``config.yaml``) until the first one appears. A target in a run renders chats
    with the run's ``model.chat_template`` and ``model.tool_prompt``. A GGUF file (or a directory
    holding one) is served from its converted HF directory (``agentrl.models.gguf``)."""
    target = _resolve_target(path, follow)
    run = target.run_dir or (target.checkpoint.parent.parent if target.checkpoint is not None else None)
    if run is not None:
        for k, v in _run_chat(run).items():
            setattr(target, k, v)
    return target


def _resolve_target(path: str | Path, follow: bool) -> ServeTarget:
    p = Path(path).expanduser()
    if p.exists():
        if find_gguf(p, "serve PATH") is not None:
            if follow:
                raise ConfigError(f"serve: --follow needs a run directory; {str(path)!r} is a GGUF model")
            return ServeTarget(resolve_model(str(p), what="serve PATH"))
    if not p.exists():
        try:
            ref = parse_ref(str(path), what="serve PATH")
        except ConfigError:
            raise ConfigError(
                f"serve: {str(path)!r} does not exist and is not a Hub id ('org/name' or 'org/name@revision')"
            ) from None
        if isinstance(ref, HubRef):  # a Hub id: fetched into (or found in) the HF cache, then a model directory
            if follow:
                raise ConfigError(f"serve: --follow needs a run directory; {str(path)!r} is a Hub model id")
            model_dir = resolve_model(str(path), what="serve PATH")
            return ServeTarget(model_dir, None, None, 0)
    if not p.is_dir():
        raise ConfigError(
            f"serve: {str(path)!r} is a file; pass an HF model directory, a checkpoint directory or a run directory"
        )
    if (p / "checkpoints").is_dir() or ((p / "config.yaml").is_file() and not (p / "config.json").exists()):
        run = p
        ckpt = latest_checkpoint(run)
        if ckpt is not None:
            return ServeTarget(ckpt, run, ckpt, checkpoint_version(ckpt))
        if not follow:
            raise ConfigError(
                f"serve: run directory {str(path)!r} has no complete checkpoint yet "
                f"(none of {run / 'checkpoints'}/step_*/ has a {MARKER} marker); "
                "pass --follow to serve its initial model until one appears"
            )
        return ServeTarget(_run_initial_model(run), run, None, 0)
    if checkpoint_step(p) is not None and p.parent.name == "checkpoints":
        if not (p / MARKER).exists():
            raise ConfigError(
                f"serve: checkpoint {str(path)!r} is incomplete (no {MARKER} marker): "
                "it is still being written or its save failed"
            )
        return ServeTarget(p, p.parent.parent if follow else None, p, checkpoint_version(p))
    if not (p / "config.json").is_file():
        raise ConfigError(
            f"serve: {str(path)!r} is not an HF model directory (no config.json), a checkpoint "
            "(RUN/checkpoints/step_N/) or a run directory (with checkpoints/)"
        )
    if follow:
        raise ConfigError(
            f"serve: --follow needs a run directory or one of its checkpoints; {str(path)!r} is a plain model directory"
        )
    return ServeTarget(p)


# ---------------------------------------------------------------------------------------- follow
class CheckpointFollower:
    """Polls ``run_dir`` every ``poll_s`` seconds; when a complete checkpoint newer than the one
    served appears, awaits ``apply(checkpoint, version)``. A failed swap (a checkpoint rotated away
    mid-read, a server error) is logged and retried at the next poll; the old weights stay served."""

    def __init__(
        self,
        target: ServeTarget,
        apply: Callable[[Path, int], Awaitable[None]],
        *,
        poll_s: float = 2.0,
        log: Callable[[str], None] = print,
    ) -> None:
        if target.run_dir is None:
            raise ConfigError("CheckpointFollower needs a target with a run directory")
        self.target, self.apply, self.poll_s, self.log = target, apply, poll_s, log
        self.swaps = 0
        self.last_error: str | None = None

    async def poll_once(self) -> Path | None:
        """Swap to the newest checkpoint if it is newer than the served one; return it if swapped."""
        run_dir = self.target.run_dir
        assert run_dir is not None  # __init__ refuses a target without one
        newest = latest_checkpoint(run_dir)
        if newest is None:
            return None
        current = self.target.checkpoint
        newest_step = checkpoint_step(newest)
        if newest_step is None or (current is not None and newest_step <= (checkpoint_step(current) or -1)):
            return None
        try:
            version = checkpoint_version(newest)
            t0 = time.perf_counter()
            await self.apply(newest, version)
        except (AgentRLError, OSError, ValueError, RuntimeError) as e:
            self.last_error = f"{newest}: {e}"
            self.log(f"agentrl serve: could not load {newest} (will retry): {e}")
            return None
        self.target.model_dir, self.target.checkpoint, self.target.version = newest, newest, version
        self.swaps += 1
        self.log(
            f"agentrl serve: now serving {newest} (policy version {version}, swapped in "
            f"{time.perf_counter() - t0:.2f}s)"
        )
        return newest

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.poll_s)


# ---------------------------------------------------------------------------------------- local
class LocalServer:
    """The local backend: an in-process engine behind an OpenAI-compatible HTTP server.

    ``start()`` loads the model and listens (``port=0`` picks a free port; see :attr:`url`);
    ``stop()`` closes the socket, the follower and the engine. ``follow`` needs ``target.run_dir``."""

    def __init__(
        self,
        target: ServeTarget,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        name: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 32,
        follow: bool = False,
        poll_s: float = 2.0,
        default_max_tokens: int = 512,
        verbose: bool = False,
        log: Callable[[str], None] = print,
    ) -> None:
        if follow and target.run_dir is None:
            raise ConfigError(f"serve: --follow needs a run directory; {target.model_dir} is not in one")
        self.target, self.host, self.port = target, host, port
        self.name = name or default_name(target)
        self.device, self.dtype, self.max_batch_size = device, dtype, max_batch_size
        self.follow, self.poll_s, self.default_max_tokens = follow, poll_s, default_max_tokens
        self.verbose, self.log = verbose, log
        self.loop = asyncio.new_event_loop()
        self.follower: CheckpointFollower | None = None
        self._threads: list[threading.Thread] = []
        self._http = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> LocalServer:
        import torch

        from agentrl.engine.local.engine import LocalEngine  # lazy: pulls in torch

        t = self.target
        try:
            tokenizer, chat = load_chat_tokenizer(t.model_dir, t.chat_template, t.tool_prompt)
        except AgentRLError:
            raise
        except (OSError, ValueError) as e:
            raise ConfigError(f"serve: cannot load a model from {t.model_dir}: {e}") from e
        self.log(chat.line())
        try:
            dtype = getattr(torch, self.dtype, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"dtype {self.dtype!r} is not a torch dtype (float32, bfloat16, float16)")
            self.engine = LocalEngine.from_pretrained(
                str(self.target.model_dir), device=self.device, dtype=dtype, max_batch_size=self.max_batch_size
            )
        except (OSError, ValueError, AttributeError) as e:
            raise ConfigError(f"serve: cannot load a model from {self.target.model_dir}: {e}") from e
        self.api = OpenAIAPI(
            self.engine, tokenizer, self.name, default_max_tokens=self.default_max_tokens, weights=self.target.describe
        )
        loop_thread = threading.Thread(target=self.loop.run_forever, name="agentrl-serve-loop", daemon=True)
        loop_thread.start()
        self._threads.append(loop_thread)
        self._call(self.engine.start())
        # no tensors, just the version: tokens sampled from a checkpoint carry its policy version
        self._call(self.engine.update_weights({}, self.target.version))
        if self.follow:
            self.follower = CheckpointFollower(self.target, self._swap, poll_s=self.poll_s, log=self.log)
            self._follow_task = asyncio.run_coroutine_threadsafe(self.follower.run(), self.loop)
        from agentrl.serving.app import HTTPServer, build_app  # lazy: pulls in fastapi

        try:
            self._http = HTTPServer(build_app(self.api), self.host, self.port, self.loop, verbose=self.verbose).start()
        except BaseException:
            self.stop()
            raise
        self.port = self._http.port
        return self

    async def _swap(self, ckpt: Path, version: int) -> None:
        from agentrl.trainer.checkpoint import read_hf  # lazy: pulls in torch

        state = await asyncio.to_thread(read_hf, ckpt, self.engine.model)
        await self.engine.update_weights(state, version)

    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def wait(self) -> None:
        """Block until interrupted (Ctrl-C)."""
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()
            self._http = None
        if self.follower is not None:
            self.loop.call_soon_threadsafe(self._follow_task.cancel)
        if hasattr(self, "engine") and self.loop.is_running():
            self._call(self.engine.close(), timeout=60)
        if self.loop.is_running():
            self._call(_cancel_pending(), timeout=30)  # e.g. the SSE library's shutdown watchers
        self.loop.call_soon_threadsafe(self.loop.stop)
        for t in self._threads:
            t.join(timeout=10)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _cancel_pending() -> None:
    """Cancel and await every other task of the running loop, so none is destroyed pending."""
    me = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not me]
    for t in rest:
        t.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


def default_name(target: ServeTarget) -> str:
    """The served model name: the run directory's name when following/serving a run, else the model dir's."""
    return (target.run_dir or target.model_dir).resolve().name


# ---------------------------------------------------------------------------------------- sglang
class SGLangService:
    """The sglang backend: one supervised SGLang server on the target's weights (it serves
    ``/v1``); with ``follow``, newer checkpoints are pushed with ``/update_weights_from_disk``.
    ``port`` None or 0 picks a free one. SGLang accepts any model name in requests, and after a swap
    its ``/v1/models`` lists the checkpoint's path (its own behaviour); ``/model_info`` has the
    ``weight_version`` (the policy version)."""

    def __init__(
        self,
        target: ServeTarget,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        name: str | None = None,
        follow: bool = False,
        poll_s: float = 2.0,
        log: Callable[[str], None] = print,
        **server_kwargs,
    ) -> None:
        from agentrl.engine.sglang.server import SGLangServer, unavailable_reason  # lazy: pulls in httpx

        reason = unavailable_reason()
        if reason:
            raise EngineError(f"serve --backend sglang: {reason}")
        if follow and target.run_dir is None:
            raise ConfigError(f"serve: --follow needs a run directory; {target.model_dir} is not in one")
        self.target, self.follow, self.poll_s, self.log = target, follow, poll_s, log
        self.name = name or default_name(target)
        self.server = SGLangServer(target.model_dir, host=host, port=port, **server_kwargs)
        self._base_args = list(self.server.extra_args) + self._chat_args()
        self.follower = CheckpointFollower(target, self._swap, poll_s=poll_s, log=log) if follow else None

    @property
    def url(self) -> str:
        return self.server.url

    def _chat_args(self) -> list[str]:
        """``--chat-template FILE`` when agentrl renders chats differently from the model's own template
        (``model.chat_template`` set, or agentrl's tool block added), so SGLang's ``/v1`` renders as
        a run would; [] otherwise. The file is kept in the agentrl cache under the template's hash."""
        import hashlib
        import os

        from transformers import AutoTokenizer

        t = self.target
        tok = AutoTokenizer.from_pretrained(str(t.model_dir))
        own = tok.chat_template
        text = None if t.chat_template is None else template_text(t.chat_template)
        chat = prepare(tok, text, t.tool_prompt, name=t.chat_template, model=str(t.model_dir))
        self.log(chat.line())
        if tok.chat_template == own or not isinstance(tok.chat_template, str):
            return []
        f = cache_dir() / "chat-templates" / (hashlib.sha256(tok.chat_template.encode()).hexdigest()[:32] + ".jinja")
        if not f.is_file():
            f.parent.mkdir(parents=True, exist_ok=True)
            tmp = f.with_name(f"{f.name}.{os.getpid()}.tmp")
            tmp.write_text(tok.chat_template, encoding="utf-8")
            tmp.replace(f)
        return ["--chat-template", str(f)]

    def _args(self) -> list[str]:
        return [*self._base_args, "--served-model-name", self.name, "--weight-version", str(self.target.version)]

    def start(self) -> SGLangService:
        self.server.extra_args = self._args()
        self.server.start()
        return self

    async def _swap(self, ckpt: Path, version: int) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=600) as client:
            r = await client.post(
                f"{self.url}/update_weights_from_disk", json={"model_path": str(ckpt), "weight_version": str(version)}
            )
        if r.status_code != 200 or not r.json().get("success", False):
            raise EngineError(f"SGLang refused {ckpt}: HTTP {r.status_code} {r.text[:300]}")

    async def supervise(self, check_s: float = 5.0) -> None:
        """Restart the server on the newest weights when it dies; follow the run. Runs until cancelled."""
        last_poll = 0.0
        while True:
            if not self.server.alive():
                self.log(
                    f"agentrl serve: the SGLang server died; restarting on {self.target.model_dir}\n"
                    f"{self.server.log_tail()}"
                )
                self.server.model_path = str(self.target.model_dir)
                self.server.extra_args = self._args()
                await asyncio.to_thread(self.server.restart)
            if self.follower is not None and time.monotonic() - last_poll >= self.poll_s:
                last_poll = time.monotonic()
                await self.follower.poll_once()
            await asyncio.sleep(min(check_s, self.poll_s))

    def stop(self) -> None:
        self.server.stop()
