"""Choosing a sandbox backend, and the process-wide shared sandboxes.

Owns: ``make_sandbox`` (a new sandbox of a named backend, or ``"auto"``: docker when a daemon answers
and the image exists, else local), ``shared_sandbox``/``default_sandbox`` (one instance per backend and
options per process, so that its concurrency bound is global) and ``docker_unavailable_reason``.
Does not: define the seam (``agentrl.sandbox.base``) or isolate anything (each backend's module).
Backends are imported lazily: choosing ``local`` never imports the docker SDK.
"""

from __future__ import annotations

import threading

from agentrl.errors import ConfigError
from agentrl.sandbox.base import Sandbox
from agentrl.sandbox.local import LocalSandbox
from agentrl.sandbox.probe import docker_unavailable_reason
from agentrl.sandbox.subprocess_runner import SubprocessSandbox

#: Names ``make_sandbox`` accepts.
BACKENDS = ("auto", "local", "docker", "subprocess")


def make_sandbox(backend: str = "auto", **options) -> Sandbox:
    """A new sandbox of ``backend``:

    * ``"local"``: ``agentrl.sandbox.local.LocalSandbox`` (rlimits; bubblewrap when available);
    * ``"docker"``: ``agentrl.sandbox.docker.DockerSandbox`` (imported lazily);
    * ``"subprocess"``: ``SubprocessSandbox``, no isolation (tests, trusted code);
    * ``"auto"``: docker if its module imports, a daemon answers and the image exists, else local.
      With ``"auto"`` only options every backend takes are allowed (``limits``, ``max_concurrency``).

    ``options`` go to the backend's constructor. Unknown backend -> ConfigError naming the choices.
    """
    if backend == "auto":
        _check_auto_options(options)
        backend = "docker" if docker_unavailable_reason() is None else "local"
    if backend == "local":
        return LocalSandbox(**options)
    if backend == "subprocess":
        return SubprocessSandbox(**options)
    if backend == "docker":
        try:
            from agentrl.sandbox.docker import DockerSandbox  # optional: an ImportError becomes the ConfigError below
        except ImportError as e:
            raise ConfigError(f"sandbox backend 'docker' is not available: {e}") from e
        return DockerSandbox(**options)
    raise ConfigError(f"sandbox backend must be one of {list(BACKENDS)}, got {backend!r}")


def _check_auto_options(options: dict) -> None:
    extra = sorted(set(options) - {"limits", "max_concurrency"})
    if extra:
        raise ConfigError(
            f"sandbox backend 'auto' takes only the options every backend takes (limits, "
            f"max_concurrency), got {extra}; name the backend to pass backend-specific options"
        )


def shared_sandbox(backend: str = "local", **options) -> Sandbox:
    """The process-wide sandbox of ``backend`` with ``options`` (built on first use). Shared so that
    its concurrency bound is global: envs are built per episode, and a sandbox per env would bound
    nothing. ``"auto"`` is resolved once per process."""
    global _AUTO
    if backend not in BACKENDS:
        raise ConfigError(f"sandbox backend must be one of {list(BACKENDS)}, got {backend!r}")
    with _SHARED_LOCK:  # envs may be built from several threads; a second instance would double the bound
        if backend == "auto":
            _check_auto_options(options)
            if _AUTO is None:
                _AUTO = "docker" if docker_unavailable_reason() is None else "local"
            backend = _AUTO
        try:
            key = (backend, tuple(sorted(options.items())))
            hash(key)
        except TypeError:
            raise ConfigError(f"shared sandbox options must be hashable values, got {options!r}") from None
        sb = _SHARED.get(key)
        if sb is None:
            sb = _SHARED[key] = make_sandbox(backend, **options)
        return sb


def default_sandbox() -> Sandbox:
    """The process-wide local sandbox (``shared_sandbox("local")``)."""
    return shared_sandbox("local")


_SHARED: dict[tuple, Sandbox] = {}
_SHARED_LOCK = threading.RLock()
_AUTO: str | None = None

__all__ = ["BACKENDS", "default_sandbox", "docker_unavailable_reason", "make_sandbox", "shared_sandbox"]
