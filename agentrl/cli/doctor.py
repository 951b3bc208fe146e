"""`agentrl doctor`: what this machine can do for a run, in one table (registered by agentrl.cli.main).

Owns the checks (each a small function returning a :class:`Check`: a name, a status and one line of
detail), printing them as a rich table or ``--json``, and ``--smoke``: a 2-step ``agentrl run`` of
the chosen config (``-c``/``--set``) with tiny counts, in a child process with a deadline. The
checks: python and torch, CUDA (devices, names, memory), NCCL, SGLang (installed, the pinned release or not; or
the configured servers' versions), the Docker daemon, bubblewrap, the sandbox line a run would print, Ray (installed,
cluster reachable), the Hugging Face Hub (reachable, or offline; whether HF_TOKEN is set, never its
value), the device and dtype a run would use, and a torchrun launch (which ``agentrl run`` refuses).

Status: ``ok`` (works), ``no`` (not available: fine unless the config needs it), ``warn`` (set up
but not answering), ``info``. A check never raises: its failure is its detail. Does not fix
anything, and does not decide anything a run decides (it asks the modules that do).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from agentrl.cli.errors import fail
from agentrl.cli.options import ConfigOpt, SetOpt, load
from agentrl.errors import AgentRLError

console = Console()
TIMEOUT_S = 3.0
STYLE = {"ok": "green", "no": "yellow", "warn": "red", "info": "cyan"}


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | no | warn | info
    detail: str


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


# -- checks -------------------------------------------------------------------------------------
def check_python(cfg: Any) -> list[Check]:
    import torch

    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    return [
        Check("python", "info", f"{platform.python_version()} ({sys.executable})"),
        Check("torch", "info", f"{torch.__version__} ({build})"),
    ]


def check_cuda(cfg: Any) -> list[Check]:
    import torch

    from agentrl.models.device import probe  # lazy: keeps CLI start light

    found = probe()
    if not found.cuda:
        why = "torch is a CPU-only build" if not torch.version.cuda else "no GPU visible (driver, CUDA_VISIBLE_DEVICES)"
        return [Check("cuda", "no", why)]
    mem = []
    for i in range(found.count):
        try:
            mem.append(_gib(torch.cuda.get_device_properties(i).total_memory))
        except Exception:  # noqa: BLE001
            mem.append("?")
    rows = [f"cuda:{i} {name} ({m})" for i, (name, m) in enumerate(zip(found.names, mem))]
    return [Check("cuda", "ok", f"{found.count} device(s): " + "; ".join(rows))]


def check_nccl(cfg: Any) -> list[Check]:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return [Check("nccl", "no", "torch.distributed has no NCCL backend (CPU runs use gloo)")]
    try:
        v = torch.cuda.nccl.version()
        version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:  # noqa: BLE001
        version = f"version unknown ({type(e).__name__})"
    return [
        Check(
            "nccl",
            "ok" if torch.cuda.is_available() else "info",
            f"NCCL {version} built in" + ("" if torch.cuda.is_available() else "; no GPU to use it on"),
        )
    ]


def _http_json(url: str) -> Any:
    import httpx

    r = httpx.get(url, timeout=TIMEOUT_S)
    r.raise_for_status()
    return r.json()


def check_sglang(cfg: Any) -> list[Check]:
    urls = list(getattr(cfg.engine, "urls", []) or [])
    if urls:
        out = []
        for u in urls:
            try:
                info = _http_json(u.rstrip("/") + "/server_info")
                out.append(
                    Check(
                        "sglang server",
                        "ok",
                        f"{u}: SGLang {info.get('version', '?')}, model {info.get('model_path', '?')}",
                    )
                )
            except Exception as e:  # noqa: BLE001
                out.append(Check("sglang server", "warn", f"{u}: not answering ({type(e).__name__})"))
        return out
    from agentrl.engine.sglang.install import SGLANG_VERSION, VERSION_PROBE  # lazy: keeps CLI start light
    from agentrl.engine.sglang.server import sglang_python, unavailable_reason  # lazy: pulls in httpx

    reason = unavailable_reason()
    if reason:
        return [Check("sglang", "no", reason)]
    py = sglang_python()
    try:
        v = subprocess.run([py, "-c", VERSION_PROBE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [Check("sglang", "warn", f"cannot run {py}: {type(e).__name__}")]
    if v.returncode != 0:
        return [
            Check(
                "sglang",
                "warn",
                f"{py} has no usable sglang package: {(v.stderr.strip().splitlines() or ['?'])[-1][:160]}",
            )
        ]
    found = v.stdout.strip()
    if found != SGLANG_VERSION:
        return [
            Check(
                "sglang",
                "warn",
                f"sglang {found} installed ({py}); agentrl is tested with {SGLANG_VERSION}: run `agentrl setup sglang`",
            )
        ]
    return [Check("sglang", "ok", f"sglang {found} installed ({py})")]


def check_docker(cfg: Any) -> list[Check]:
    from agentrl.sandbox.probe import docker_unavailable_reason  # lazy: keeps CLI start light

    reason = docker_unavailable_reason()
    return [Check("docker", "no", reason) if reason else Check("docker", "ok", "daemon answers, sandbox image present")]


def check_bwrap(cfg: Any) -> list[Check]:
    from agentrl.sandbox.local import bwrap_unavailable_reason  # lazy: keeps CLI start light

    reason = bwrap_unavailable_reason()
    return [Check("bubblewrap", "no", reason) if reason else Check("bubblewrap", "ok", "bwrap runs here")]


def check_sandbox(cfg: Any) -> list[Check]:
    from agentrl.envs.registry import make  # lazy: pulls in gymnasium
    from agentrl.sandbox.base import env_isolation_line  # lazy: keeps CLI start light

    env = make(cfg.env.id, **cfg.env.kwargs)
    try:
        line = env_isolation_line(env)
    finally:
        env.close()
    return [Check("sandbox", "info", f"env {cfg.env.id}: " + (line or "no sandbox (the env runs no code)"))]


def ray_address(cfg: Any) -> str | None:
    """The Ray cluster a run would join: ray.address, else $RAY_ADDRESS; ``auto`` -> the address
    of the cluster started on this machine (Ray's own record), if any."""
    addr = getattr(getattr(cfg, "ray", None), "address", None) or os.environ.get("RAY_ADDRESS")
    if addr == "auto":
        rec = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        return rec.read_text().strip() if rec.is_file() else None
    return addr


def _tcp(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S):
            return True
    except OSError:
        return False


def check_ray(cfg: Any) -> list[Check]:
    try:
        import ray
    except ImportError:
        return [Check("ray", "no", "not installed (pip install 'agentrl[ray]'); needed for distributed: ray")]
    out = [Check("ray", "ok", f"ray {ray.__version__} installed")]
    raw = getattr(getattr(cfg, "ray", None), "address", None) or os.environ.get("RAY_ADDRESS")
    if not raw:
        out.append(Check("ray cluster", "info", "no RAY_ADDRESS / ray.address: a run starts a local Ray instance"))
        return out
    addr = ray_address(cfg)
    if addr is None:
        out.append(Check("ray cluster", "warn", f"{raw!r}: no Ray cluster was started on this machine"))
        return out
    hostport = addr.removeprefix("ray://").rstrip("/")
    host, _, port = hostport.rpartition(":")
    port_n = int(port) if port.isdigit() else (10001 if addr.startswith("ray://") else 6379)
    host = host or hostport
    ok = _tcp(host, port_n)
    out.append(
        Check(
            "ray cluster",
            "ok" if ok else "warn",
            f"{addr}: " + ("answers (TCP)" if ok else f"no answer within {TIMEOUT_S:.0f} s"),
        )
    )
    return out


def check_hub(cfg: Any) -> list[Check]:
    from agentrl.models.hub import hub_cache_dir, hub_endpoint, offline  # lazy: keeps CLI start light

    token = (
        "HF_TOKEN set" if (os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")) else "no HF_TOKEN"
    )
    where = f"cache {hub_cache_dir()}; {token}"
    if offline():
        return [Check("hf hub", "info", f"offline (HF_HUB_OFFLINE=1): cached models only; {where}")]
    import httpx

    url = hub_endpoint()
    try:
        r = httpx.head(url, timeout=TIMEOUT_S, follow_redirects=True)
        return [Check("hf hub", "ok", f"{url} answers (HTTP {r.status_code}); {where}")]
    except httpx.HTTPError as e:
        return [
            Check(
                "hf hub",
                "warn",
                f"{url} not reachable within {TIMEOUT_S:.0f} s ({type(e).__name__}): Hub ids "
                f"resolve from the cache only (set HF_HUB_OFFLINE=1 to skip the network); {where}",
            )
        ]


def check_device(cfg: Any) -> list[Check]:
    from agentrl.models.device import device_line, resolve_device  # lazy: keeps CLI start light

    resolved = resolve_device(cfg)
    model = cfg.model.path or "the built-in tiny model"
    return [Check("run device", "info", f"{device_line(resolved)}; model {model}")]


def check_launcher(cfg: Any) -> list[Check]:
    ws = os.environ.get("WORLD_SIZE")
    if ws and ws != "1":
        return [Check("launcher", "warn", f"WORLD_SIZE={ws}: `agentrl run` refuses torchrun; use distributed: ray")]
    return []


CHECKS: list[Callable[[Any], list[Check]]] = [
    check_python,
    check_cuda,
    check_nccl,
    check_sglang,
    check_docker,
    check_bwrap,
    check_sandbox,
    check_ray,
    check_hub,
    check_device,
    check_launcher,
]


def run_checks(cfg: Any, checks: list[Callable[[Any], list[Check]]] | None = None) -> list[Check]:
    """Every check's rows; a check that raises becomes a ``warn`` row naming its error."""
    out: list[Check] = []
    for fn in checks or CHECKS:
        name = fn.__name__.removeprefix("check_")
        try:
            out.extend(fn(cfg))
        except Exception as e:  # noqa: BLE001 - one broken probe must not hide the others
            first = (str(e).strip().splitlines() or [""])[0][:200]
            out.append(Check(name, "warn", f"check failed: {type(e).__name__}: {first}"))
    return out


# -- smoke --------------------------------------------------------------------------------------
SMOKE_SETS = [
    "train.steps=2",
    "train.groups_per_step=1",
    "rollout.num_prompts=1",
    "rollout.group_size=2",
    "rollout.max_turns=1",
    "rollout.max_new_tokens=16",
    "eval.num_tasks=0",
    "logging.tensorboard=false",
    "logging.trajectories_per_step=0",
]


def smoke(config: list[str], sets: list[str], timeout_s: float) -> Check:
    """A 2-step ``agentrl run`` of the config with tiny counts, in a child process, within ``timeout_s``."""
    with tempfile.TemporaryDirectory(prefix="agentrl-doctor-") as tmp:
        argv = [sys.executable, "-m", "agentrl", "run", "-q", "-o", str(Path(tmp) / "run")]
        for c in config:
            argv += ["-c", c]
        for s in [*sets, *SMOKE_SETS]:
            argv += ["--set", s]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Check("smoke run", "warn", f"2-step run did not finish within {timeout_s:.0f} s")
        took = time.perf_counter() - t0
        if proc.returncode != 0:
            tail = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if ln.strip()][-1:] or ["?"]
            return Check(
                "smoke run", "warn", f"2-step run failed (exit {proc.returncode}, {took:.0f} s): {tail[0][:300]}"
            )
        return Check("smoke run", "ok", f"2-step run finished in {took:.0f} s")


# -- command ------------------------------------------------------------------------------------
def render(checks: list[Check]) -> Table:
    tab = Table(title="agentrl doctor")
    for col in ("check", "status", "detail"):
        tab.add_column(col, overflow="fold")
    for c in checks:
        tab.add_row(c.name, f"[{STYLE.get(c.status, 'white')}]{c.status}[/]", c.detail)
    return tab


def doctor_cmd(
    config: list[str] | None = ConfigOpt,
    sets: list[str] | None = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON (a list of {name, status, detail})."),
    run_smoke: bool = typer.Option(
        False, "--smoke", help="Also run a 2-step `agentrl run` of the config with tiny counts."
    ),
    smoke_timeout_s: float = typer.Option(
        600.0, "--smoke-timeout", help="--smoke: seconds before the run counts as failed."
    ),
) -> None:
    """Report what this machine can do: GPUs, NCCL, SGLang, Docker, bubblewrap, Ray, the Hub, the device a run would
    use."""
    try:
        cfg = load(config, sets)
    except AgentRLError as e:
        fail(e)
    checks = run_checks(cfg)
    if run_smoke:
        checks.append(smoke(list(config or []), list(sets or []), smoke_timeout_s))
    if as_json:
        typer.echo(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        console.print(render(checks))
    if run_smoke and checks[-1].status != "ok":
        raise typer.Exit(1)
