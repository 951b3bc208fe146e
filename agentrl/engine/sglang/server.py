"""Launching and supervising one ``sglang.launch_server`` process.

Owns: where SGLang's Python lives (it pins its own torch, so it sits in its own virtualenv; the pinned
version and the install are ``agentrl.engine.sglang.install``'s), the launch flags (the CPU flags in ONE
place, and what SGLang must read otherwise in a model's config.json: :func:`config_overrides`), picking a
free port (and starting again on a fresh one, a bounded number of times, when another program took it
before the server bound it: ``agentrl.common.ports``), waiting until the server - this one, not another
program on its port - answers ``/health``, killing (its whole process group) and restarting, and the
server's log file (its tail goes into every error; agentrl's own notes are lines starting ``===``).
Does not send generation requests or route between servers (``agentrl.engine.sglang.engine``).

Where SGLang is looked for, first hit wins:
``$AGENTRL_SGLANG_PYTHON`` (a python executable), ``$AGENTRL_CACHE/sglang-venv/bin/python`` (what
``agentrl setup sglang`` makes: ``agentrl.engine.sglang.install``), then this interpreter if it can import
``sglang``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from agentrl.common.llm_api import without_secrets
from agentrl.common.ports import addr_in_use, free_port, listener_is_ours
from agentrl.common.reaper import Reaper
from agentrl.engine.sglang.install import SGLANG_VERSION as SGLANG_VERSION  # the pin, re-exported: it lives there
from agentrl.engine.sglang.install import venv_python
from agentrl.errors import EngineError

log = logging.getLogger("agentrl.engine.sglang")

#: Flags that make SGLang run on a CPU (not an officially supported mode, so pinned here): the transformers model
#: implementation (the
#: default one imports vllm), torch-native attention and sampling, no CUDA graphs, and
#: ``--sleep-on-idle`` (an idle scheduler otherwise spins a whole core, measured, slowing everything
#: else on a small machine; it wakes at once on a request).
CPU_FLAGS = (
    "--device",
    "cpu",
    "--model-impl",
    "transformers",
    "--attention-backend",
    "torch_native",
    "--disable-cuda-graph",
    "--sampling-backend",
    "pytorch",
    "--sleep-on-idle",
)


def config_overrides(model_path: str | Path) -> dict:
    """Fields of ``model_path``'s ``config.json`` SGLang must read otherwise (its ``--json-model-override-args``;
    the file is left alone), empty for almost every model.

    A ``quantization_config`` naming ``gguf``: a model transformers loaded from a .gguf file carries it, and a
    directory saved from it by hand (rebuilt from that config, given the dequantized weights) keeps it over plain
    float safetensors. transformers ignores it there (the trainer and the local engine load the weights as they
    are); SGLang takes it for GGUF-quantized weights, builds GGUF linear layers (``qweight``, no ``weight``) and
    refuses the first plain weight: "No module or parameter named 'model.layers.0.mlp.down_proj.weight' in
    TransformersForCausalLM". A directory cannot hold GGUF weights (SGLang reads those from a .gguf file only),
    so the field is dropped: SGLang then serves the weights transformers reads. agentrl's own conversion
    (``agentrl.models.gguf``) never writes it."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # SGLang says what is wrong with the file
    quant = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "gguf":
        return {"quantization_config": None}
    return {}


def sglang_python() -> str | None:
    """The python executable that can run ``sglang.launch_server``, or None."""
    env = os.environ.get("AGENTRL_SGLANG_PYTHON")
    if env:
        return env
    venv = venv_python()
    if venv.exists():
        return str(venv)
    if importlib.util.find_spec("sglang") is not None:
        return sys.executable
    return None


def unavailable_reason() -> str | None:
    """Why no SGLang server can be started here (None when one can)."""
    py = sglang_python()
    if py is None:
        return (
            "SGLang is not installed: run `agentrl setup sglang` (installs the pinned release in "
            "$AGENTRL_CACHE/sglang-venv) or set AGENTRL_SGLANG_PYTHON to a python that has sglang"
        )
    if not Path(py).exists():
        return f"AGENTRL_SGLANG_PYTHON={py} does not exist"
    return None


class SGLangServer:
    """One supervised SGLang server process.

    ``device="cpu"`` adds :data:`CPU_FLAGS`; ``max_total_tokens`` bounds the KV cache (without it
    SGLang reserves most of the machine's memory on CPU). The model's :func:`config_overrides` go in as
    ``--json-model-override-args``. ``dtype`` is SGLang's ``--dtype``; the
    default (None) is ``float32`` on CPU, where SGLang's own default would serve an fp32 checkpoint in
    fp16 (behaviour logprobs then differ from an fp32 trainer's by ~2e-2 instead of ~1e-5), and
    SGLang's ``auto`` elsewhere. ``extra_args`` are appended verbatim. ``port`` None (or 0): a free
    one, and a fresh one for each new launch when the server finds it taken (``PORT_ATTEMPTS``
    launches in all; :attr:`url` follows); a port given is used as is. ``reap_with_owner``: a
    watchdog (:class:`agentrl.common.reaper.Reaper`) kills the server when this process dies without
    stopping it (SIGKILL, a crash): the server runs in a session of its own and would outlive it;
    ``reaper``: the owner's own watchdog, told about every process this server spawns and kills
    (not closed by :meth:`stop`). Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    #: launches of a server whose port was taken before it could bind it (EADDRINUSE), each on a
    #: fresh port, before giving up; only when agentrl chose the port
    PORT_ATTEMPTS = 3

    def __init__(
        self,
        model_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        device: str = "cpu",
        max_total_tokens: int = 32768,
        max_running_requests: int = 64,
        dtype: str | None = None,
        extra_args: Sequence[str] = (),
        python: str | None = None,
        log_path: str | Path | None = None,
        startup_timeout_s: float = 240.0,
        reap_with_owner: bool = False,
        reaper=None,
    ) -> None:
        if not Path(model_path).is_dir():
            raise EngineError(f"SGLang model path {model_path} is not a directory")
        self.model_path = str(model_path)
        self.host, self.port = host, port or free_port(host)
        self.port_chosen = not port  # ours to change when another program takes it
        self.device = device
        self.max_total_tokens, self.max_running_requests = max_total_tokens, max_running_requests
        self.dtype = dtype or ("float32" if device == "cpu" else "auto")
        self.extra_args = list(extra_args)
        self.overrides = config_overrides(model_path)
        if self.overrides:
            log.info(
                "%s/config.json declares GGUF quantization over plain safetensors weights: SGLang reads it without "
                "quantization_config (--json-model-override-args), as transformers does",
                self.model_path,
            )
        self.python = python or sglang_python()
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"agentrl-sglang-{self.port}.log"
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.reap_with_owner = reap_with_owner
        self._reaper, self._own_reaper = reaper, False
        self._log_start = 0  # where the current launch's part of the log begins
        # stop() and spawning exclude each other; a stop() while a restart() is under way (another
        # thread: the engine restarts in a worker thread) makes that restart spawn nothing.
        self._spawn_lock = threading.Lock()
        self._stops = 0
        # one waiter relaunches at a time (a Ray engine actor's ready() and restart() run on threads)
        self._ready_lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        if self.python is None:
            raise EngineError(unavailable_reason() or "SGLang not found")
        cmd = [
            self.python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.model_path,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-total-tokens",
            str(self.max_total_tokens),
            "--max-running-requests",
            str(self.max_running_requests),
            "--dtype",
            self.dtype,
        ]
        if self.device == "cpu":
            cmd += CPU_FLAGS
        if self.overrides:  # an --json-model-override-args of extra_args comes later and wins
            cmd += ["--json-model-override-args", json.dumps(self.overrides)]
        return cmd + self.extra_args

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, wait: bool = True) -> SGLangServer:
        """Spawn the server (a new process group, output to ``log_path``); wait until ready."""
        with self._spawn_lock:
            if self.alive():
                return self
            self._spawn()
        if wait:
            self.wait_ready()
        return self

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            log.write(f"\n=== agentrl: starting {' '.join(self.command())}\n".encode())
            log.flush()

            # SGLang needs no API key: none reaches it, its log or its children
            env = {**without_secrets(), "PYTHONUNBUFFERED": "1"}
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        if self._reaper is None and self.reap_with_owner:
            self._reaper, self._own_reaper = Reaper(), True
        if self._reaper is not None:
            self._reaper.watch(self.proc.pid)  # its own session: pid == process group id

    def _note(self, msg: str) -> None:
        """A line of agentrl's own in the server's log (and agentrl's)."""
        log.warning("SGLang server: %s (log %s)", msg, self.log_path)
        try:
            with open(self.log_path, "ab") as f:
                f.write(f"=== agentrl: {msg}\n".encode())
        except OSError:
            pass

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until ``/health`` answers 200 from this server (not another program listening on its
        port); raise EngineError (with the log tail) if the process exits or the deadline passes
        (``timeout_s`` per launch). A server that found its port taken is started again on a fresh
        one, up to ``PORT_ATTEMPTS`` launches, when agentrl chose the port; each is noted in the log."""
        with self._ready_lock:
            self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float | None) -> None:
        stops = self._stops
        for launch in range(1, self.PORT_ATTEMPTS + 1):
            taken = self._wait_launch(timeout_s or self.startup_timeout_s)
            if taken is None:
                return
            if not self.port_chosen or launch == self.PORT_ATTEMPTS:
                break
            with self._spawn_lock:
                if self._stops != stops:
                    raise EngineError(f"SGLang server on port {self.port} was stopped while starting")
                old, self.port = self.port, free_port(self.host)
                self._note(
                    f"port {old} was taken before the server could bind it ({taken}); starting again on "
                    f"port {self.port} (launch {launch + 1} of {self.PORT_ATTEMPTS})"
                )
                self._spawn()
        hint = f"{self.PORT_ATTEMPTS} free ports tried" if self.port_chosen else "pass a free port, or none"
        raise EngineError(
            f"SGLang server: port {self.port} on {self.host} is in use ({taken}); {hint}; "
            f"log {self.log_path} ends with:\n{self.log_tail()}"
        )

    def _wait_launch(self, timeout_s: float) -> str | None:
        """Wait for the current launch: None once it serves; the log line saying its port was taken
        if it logged that (its process group then killed: SGLang 0.5.23 does not exit after uvicorn's
        bind error, it hangs in "Waiting for application shutdown"); EngineError for any other end."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            alive = self.alive()  # before reading the log: a death's last words are in it by then
            taken = addr_in_use(self._launch_log())
            if taken is not None:
                self.kill()  # its scheduler and detokenizer children too
                return taken
            proc = self.proc
            if not alive or proc is None:  # alive() is False without a process
                code = None if proc is None else proc.returncode
                raise EngineError(
                    f"SGLang server on port {self.port} exited with code {code} while starting; "
                    f"log {self.log_path} ends with:\n{self.log_tail()}"
                )
            # another program answering on our port is not our server (ours will log its bind error)
            if self.healthy(timeout_s=2.0) and listener_is_ours(self.port, proc.pid) is not False:
                return None
            time.sleep(0.5)
        self.kill()
        raise EngineError(
            f"SGLang server on port {self.port} not ready after {timeout_s}s; "
            f"log {self.log_path} ends with:\n{self.log_tail()}"
        )

    def _launch_log(self) -> str:
        """The server's output since its current launch began."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def healthy(self, timeout_s: float = 5.0) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL the server's whole process group (SGLang runs scheduler/detokenizer children)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass
        if self._reaper is not None and self._reaper.proc.poll() is None:
            self._reaper.forget(self.proc.pid)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL after ``grace_s``. A restart() under way in
        another thread spawns nothing after this (it raises EngineError)."""
        with self._spawn_lock:
            self._stops += 1
        if self.proc is None:
            return
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.kill()
        if self._reaper is not None and self._own_reaper:
            self._reaper.close()
            self._reaper, self._own_reaper = None, False

    def restart(self, wait: bool = True) -> None:
        stops = self._stops
        self.kill()
        self.restarts += 1
        with self._spawn_lock:
            if self._stops != stops:
                raise EngineError(f"SGLang server on port {self.port} was stopped while restarting")
            self._spawn()
        if wait:
            self.wait_ready()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
