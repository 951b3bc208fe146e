"""The env registry: ids -> lazily imported env factories, plus third-party entry points.

Owns: ``register``, ``make``, ``spec``, ``registered`` and discovery of the ``agentrl.envs``
entry-point group. Built-in envs are registered by ``agentrl.envs`` (imported at the bottom of
this module, cheaply: no env code, no torch), both here (``code_exec``/``CodeExec-v0``,
``noop``/``Noop-v0``) and in Gymnasium's registry (``gymnasium.make("agentrl/CodeExec-v0")``).

Third-party envs: declare, in the package's pyproject,

    [project.entry-points."agentrl.envs"]
    "mypkg/Maze-v0" = "mypkg.maze:MazeEnv"

The entry point's **name is the env id** and its **value is a "module:attr" factory** (an env
class or a function returning an env) called with the id's kwargs. Entry points are read once,
on first lookup (and again whenever an id is not found, so a package installed at run time is
seen), and imported only by ``make``. An explicit ``register`` wins over an entry point of the
same id; of two entry points with one id, the first found wins (both with a warning).

Does not: construct envs at import, validate env behaviour (``agentrl.envs.checker`` does).
"""
from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrl.errors import ConfigError, RegistryError

_GROUP = "agentrl.envs"


@dataclass(frozen=True)
class EnvSpec:
    """A registered env: ``make(id)`` calls ``entry_point(**kwargs, **overrides)``.

    ``max_turns`` is a hint for the episode manager (None: use the rollout config's);
    ``source`` says where the registration came from (``register``, ``builtin``, ``entry point ...``).
    """

    id: str
    entry_point: str | Callable[..., Any]
    max_turns: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = "register"

    def make(self, **overrides: Any) -> Any:
        return make(self.id, **overrides)


_specs: dict[str, EnvSpec] = {}
_loaded: dict[str, Callable[..., Any]] = {}  # entry-point string -> imported factory
_discovered = False


def register(id: str, entry_point: str | Callable[..., Any], *, max_turns: int | None = None,
             override: bool = False, source: str = "register", **defaults: Any) -> EnvSpec:
    """Register ``id``. ``entry_point``: ``"module:attr"`` (imported at make time) or a callable.

    ``defaults`` are the env's kwargs (``make`` overrides them). Re-registering an id with the
    same definition is a no-op; with a different one it is a RegistryError unless ``override``.
    """
    if not isinstance(id, str) or not id or any(c.isspace() for c in id):
        raise RegistryError(f"env id must be a non-empty string without spaces, got {id!r}")
    if isinstance(entry_point, str):
        mod, sep, attr = entry_point.partition(":")
        if not sep or not mod or not attr:
            raise RegistryError(f"env {id!r}: entry point must look like 'module:attr', got {entry_point!r}")
    elif not callable(entry_point):
        raise RegistryError(f"env {id!r}: entry point must be 'module:attr' or a callable, got {entry_point!r}")
    if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
        raise RegistryError(f"env {id!r}: max_turns must be a positive int or None, got {max_turns!r}")
    new = EnvSpec(id=id, entry_point=entry_point, max_turns=max_turns, kwargs=dict(defaults), source=source)
    old = _specs.get(id)
    if old is not None and not override:
        if (old.entry_point, old.max_turns, old.kwargs) == (new.entry_point, new.max_turns, new.kwargs):
            return old
        raise RegistryError(f"env {id!r} is already registered ({_describe(old)}); pass override=True to replace it")
    _specs[id] = new
    return new


def _describe(s: EnvSpec) -> str:
    ep = s.entry_point if isinstance(s.entry_point, str) else getattr(s.entry_point, "__qualname__", repr(s.entry_point))
    return f"{ep}, from {s.source}"


def _discover() -> None:
    """Read the entry-point group and register ids not yet known (lazily imported)."""
    global _discovered
    _discovered = True
    importlib.invalidate_caches()  # a dist added to sys.path since the last scan
    seen: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=_GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
        value = ep.value.split("[", 1)[0].strip()  # drop "[extras]"
        where = f"entry point of {dist}"
        if ep.name in seen:
            if seen[ep.name] != value:
                warnings.warn(f"agentrl env {ep.name!r} is declared by two entry points; using {seen[ep.name]!r}, "
                              f"ignoring {value!r} ({where})", stacklevel=3)
            continue
        seen[ep.name] = value
        current = _specs.get(ep.name)
        if current is not None:
            if current.source.startswith("entry point") or current.entry_point == value:
                continue
            warnings.warn(f"entry point {ep.name!r} = {value!r} ({where}) is shadowed by an explicit "
                          f"registration ({_describe(current)})", stacklevel=3)
            continue
        try:
            register(ep.name, value, source=where)
        except RegistryError as e:
            warnings.warn(f"ignoring bad agentrl.envs entry point {ep.name!r} ({where}): {e}", stacklevel=3)


def _lookup(id: str) -> EnvSpec:
    if not _discovered:
        _discover()
    if id in _specs:
        return _specs[id]
    if id.startswith("agentrl/") and id[len("agentrl/"):] in _specs:  # Gymnasium-style built-in id
        return _specs[id[len("agentrl/"):]]
    _discover()  # maybe installed since the last scan
    if id in _specs:
        return _specs[id]
    close = difflib.get_close_matches(id, list(_specs), n=5, cutoff=0.5)
    hint = f"did you mean {', '.join(map(repr, close))}?" if close else f"registered: {', '.join(sorted(_specs)) or '(none)'}"
    raise RegistryError(f"unknown env id {id!r}; {hint}")


def spec(id: str) -> EnvSpec:
    """The ``EnvSpec`` of ``id``; RegistryError (with close matches) if unknown."""
    return _lookup(id)


def registered() -> dict[str, EnvSpec]:
    """All known ids (built-in, registered, and from entry points) -> ``EnvSpec``."""
    if not _discovered:
        _discover()
    return dict(_specs)


def load_entry_point(entry_point: str | Callable[..., Any], env_id: str = "?") -> Callable[..., Any]:
    """Import ``"module:attr"`` (cached); RegistryError naming the entry point if that fails."""
    if callable(entry_point):
        return entry_point
    if entry_point in _loaded:
        return _loaded[entry_point]
    mod_name, _, attr = entry_point.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # ImportError, AttributeError, or an error raised by the module itself
        raise RegistryError(f"env {env_id!r}: cannot load entry point {entry_point!r}: {type(e).__name__}: {e}") from e
    if not callable(obj):
        raise RegistryError(f"env {env_id!r}: entry point {entry_point!r} is not callable")
    _loaded[entry_point] = obj
    return obj


def make(id: str, **kwargs: Any) -> Any:
    """Build env ``id`` with its registered kwargs overridden by ``kwargs``."""
    s = _lookup(id)
    factory = load_entry_point(s.entry_point, s.id)
    try:
        env = factory(**{**s.kwargs, **kwargs})
    except TypeError as e:
        if "keyword argument" in str(e):  # an unknown or missing option: a config mistake
            raise ConfigError(f"env {s.id!r}: {e}") from e
        raise
    import gymnasium

    if not isinstance(env, gymnasium.Env):
        raise RegistryError(f"env {s.id!r}: entry point {_describe(s)} returned {type(env).__name__}, "
                            f"not a gymnasium.Env (subclass agentrl.envs.base.AgentEnv)")
    return env


__all__ = ["EnvSpec", "register", "make", "spec", "registered", "load_entry_point"]
