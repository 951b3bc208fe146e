"""The env registry: ids -> lazily imported env factories, plus third-party entry points, mirrored
into Gymnasium's registry.

Owns: ``register``, ``make``, ``spec``, ``registered``, ``discover`` (the ``agentrl.envs``
entry-point group), the Gymnasium mirror, and the eval-split rule of ``make`` (``check_split``). Built-in envs are
registered by ``agentrl.envs.builtin`` (cheaply: no env code, no torch).

Third-party envs: declare, in the package's pyproject,

    [project.entry-points."agentrl.envs"]
    "mypkg/Maze-v0" = "mypkg.maze:MazeEnv"

The entry point's **name is the env id** and its **value is a "module:attr" factory** (an env
class or a function returning an env) called with the id's kwargs. Entry points are read when
``agentrl.envs`` is imported (and again whenever an id is not found, so a package installed at run
time is seen), and imported only by ``make``. An explicit ``register`` wins over an entry point of
the same id; of two entry points with one id, the first found wins (both with a warning).

Gymnasium: every registered id is also registered in Gymnasium's registry under the same id
(namespace included: ``gymnasium.make("mypkg/Maze-v0")``), built-ins under ``agentrl/<Name>``;
``gymnasium.make`` then builds the env through ``make`` here. What makes an id visible to
Gymnasium is its registration, so: ``import agentrl.envs`` (or ``import agentrl`` and any use of
``agentrl.make`` / ``agentrl.register``) before ``gymnasium.make``. Ids Gymnasium cannot parse,
and ids Gymnasium already knows from another source, are not mirrored.

The eval split (the env contract, see ``agentrl.envs.base``): ``make(id, split=...)`` passes
``split`` to a factory that takes it. An env that declares it has no held-out tasks
(``has_eval_split = False`` on its class, or ``register(..., has_eval_split=False)``) gets the
``split`` keyword dropped, with a warning once per id, and evaluates on training-distribution tasks.
An env that neither takes ``split`` nor declares that is a ``ConfigError`` saying so: never a
silent failure of every eval episode. ``check_split`` applies the rule without building an env (config time).

Does not: construct envs at import, validate env behaviour (``agentrl.envs.checker`` does).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError, RegistryError

_GROUP = "agentrl.envs"


@dataclass(frozen=True)
class EnvSpec:
    """A registered env: ``make(id)`` calls ``entry_point(**kwargs, **overrides)``.

    ``max_turns`` is a hint for the episode manager (None: use the rollout config's);
    ``source`` says where the registration came from (``register``, ``builtin``, ``entry point ...``);
    ``has_eval_split`` is the eval-split declaration (None: read ``has_eval_split`` from the factory,
    else the factory must take ``split``; see the module docstring); ``gym_id`` the id in Gymnasium's
    registry (None: not mirrored); ``run_defaults`` the env's run recipe, a config layer every job
    that names this env lays under the user's own (``agentrl.envs.recipes``; empty: none).
    """

    id: str
    entry_point: str | Callable[..., Any]
    max_turns: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = "register"
    has_eval_split: bool | None = None
    gym_id: str | None = None
    run_defaults: dict[str, Any] = field(default_factory=dict)

    def make(self, **overrides: Any) -> Any:
        return make(self.id, **overrides)


_specs: dict[str, EnvSpec] = {}
_loaded: dict[str, Callable[..., Any]] = {}  # entry-point string -> imported factory
_discovered = False
_warned_no_split: set[str] = set()
_SAME = object()  # gym_id default: the agentrl id itself


def register(
    id: str,
    entry_point: str | Callable[..., Any],
    *,
    max_turns: int | None = None,
    override: bool = False,
    source: str = "register",
    has_eval_split: bool | None = None,
    gym_id: Any = _SAME,
    run_defaults: dict[str, Any] | None = None,
    **defaults: Any,
) -> EnvSpec:
    """Register ``id``. ``entry_point``: ``"module:attr"`` (imported at make time) or a callable.

    ``defaults`` are the env's kwargs (``make`` overrides them). ``has_eval_split``: False when
    the env has no held-out tasks (see the module docstring). ``gym_id``: the id to mirror into
    Gymnasium's registry (default: ``id``; None: do not mirror). ``run_defaults``: the env's run
    recipe (a config mapping, e.g. ``{"rollout": {"max_turns": 30}}``) that every job naming this env
    lays under the user's config (``agentrl.envs.recipes``). Re-registering an id with the
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
    if has_eval_split not in (None, True, False):
        raise RegistryError(f"env {id!r}: has_eval_split must be True, False or None, got {has_eval_split!r}")
    if run_defaults is not None and not isinstance(run_defaults, dict):
        raise RegistryError(f"env {id!r}: run_defaults must be a config mapping or None, got {run_defaults!r:.80}")
    new = EnvSpec(
        id=id,
        entry_point=entry_point,
        max_turns=max_turns,
        kwargs=dict(defaults),
        source=source,
        has_eval_split=has_eval_split,
        gym_id=id if gym_id is _SAME else gym_id,
        run_defaults=dict(run_defaults or {}),
    )
    old = _specs.get(id)
    if old is not None and not override:
        if _definition(old) == _definition(new):
            return old
        raise RegistryError(f"env {id!r} is already registered ({_describe(old)}); pass override=True to replace it")
    _specs[id] = new
    _mirror(new)
    return new


def _definition(s: EnvSpec) -> tuple:
    return s.entry_point, s.max_turns, s.kwargs, s.has_eval_split, s.gym_id, s.run_defaults


class GymEntry:
    """Gymnasium's entry point for a mirrored id: builds the env with agentrl's ``make``."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def __call__(self, **kwargs: Any) -> Any:
        return make(self.env_id, **kwargs)

    def __repr__(self) -> str:
        return f"agentrl.make({self.env_id!r})"


def _mirror(s: EnvSpec) -> None:
    """Register ``s`` in Gymnasium's registry under ``s.gym_id`` (see the module docstring)."""
    if not s.gym_id:
        return
    import gymnasium
    from gymnasium.envs.registration import ENV_ID_RE

    if not ENV_ID_RE.fullmatch(s.gym_id):
        return  # Gymnasium could not parse it: agentrl.make only
    existing = gymnasium.registry.get(s.gym_id)
    if existing is not None:
        if not isinstance(existing.entry_point, GymEntry):
            warnings.warn(
                f"agentrl env {s.id!r} is not mirrored into Gymnasium: Gymnasium already has "
                f"{s.gym_id!r} ({existing.entry_point!r})",
                stacklevel=3,
            )
            return
        if existing.entry_point.env_id == s.id:
            return  # mirrored already (a re-registration or override: make() reads the new spec)
        del gymnasium.registry[s.gym_id]
    try:
        # No max_episode_steps: turn limits belong to the episode manager, not a TimeLimit wrapper.
        gymnasium.register(id=s.gym_id, entry_point=GymEntry(s.id))
    except gymnasium.error.Error as e:  # e.g. an unversioned id beside versioned ones
        warnings.warn(f"agentrl env {s.id!r} is not mirrored into Gymnasium: {e}", stacklevel=3)


def _describe(s: EnvSpec) -> str:
    ep = (
        s.entry_point if isinstance(s.entry_point, str) else getattr(s.entry_point, "__qualname__", repr(s.entry_point))
    )
    return f"{ep}, from {s.source}"


def discover() -> None:
    """Read the ``agentrl.envs`` entry-point group and register (and mirror into Gymnasium) the
    ids not yet known; their code is imported only by ``make``."""
    _discover()


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
                warnings.warn(
                    f"agentrl env {ep.name!r} is declared by two entry points; using {seen[ep.name]!r}, "
                    f"ignoring {value!r} ({where})",
                    stacklevel=3,
                )
            continue
        seen[ep.name] = value
        current = _specs.get(ep.name)
        if current is not None:
            if current.source.startswith("entry point") or current.entry_point == value:
                continue
            warnings.warn(
                f"entry point {ep.name!r} = {value!r} ({where}) is shadowed by an explicit "
                f"registration ({_describe(current)})",
                stacklevel=3,
            )
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
    if id.startswith("agentrl/") and id[len("agentrl/") :] in _specs:  # Gymnasium-style built-in id
        return _specs[id[len("agentrl/") :]]
    _discover()  # maybe installed since the last scan
    if id in _specs:
        return _specs[id]
    close = difflib.get_close_matches(id, list(_specs), n=5, cutoff=0.5)
    hint = (
        f"did you mean {', '.join(map(repr, close))}?"
        if close
        else f"registered: {', '.join(sorted(_specs)) or '(none)'}"
    )
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
    """Build env ``id`` with its registered kwargs overridden by ``kwargs`` (``split``: see the
    module docstring)."""
    s = _lookup(id)
    factory = load_entry_point(s.entry_point, s.id)
    kwargs = {**s.kwargs, **kwargs}
    if "split" in kwargs and _declares_no_split(s, factory):
        split = kwargs.pop("split")
        if split != "train" and s.id not in _warned_no_split:
            _warned_no_split.add(s.id)
            warnings.warn(
                f"env {s.id!r} declares no held-out tasks (has_eval_split=False): split={split!r} is "
                "ignored and evaluation runs on tasks drawn like the training tasks",
                stacklevel=2,
            )
    try:
        env = factory(**kwargs)
    except TypeError as e:
        if "split" in kwargs and "'split'" in str(e):
            raise ConfigError(no_split_message(s.id, kwargs["split"])) from e
        if "keyword argument" in str(e):  # an unknown or missing option: a config mistake
            raise ConfigError(f"env {s.id!r}: {e}") from e
        raise
    import gymnasium

    if not isinstance(env, gymnasium.Env):
        raise RegistryError(
            f"env {s.id!r}: entry point {_describe(s)} returned {type(env).__name__}, "
            f"not a gymnasium.Env (subclass agentrl.envs.base.AgentEnv)"
        )
    return env


def check_split(id: str, kwargs: dict[str, Any]) -> None:
    """The eval-split rule of ``make(id, **kwargs)`` checked without building an env (for config
    time, before training): ConfigError when ``kwargs`` holds ``split`` and the env neither declares
    ``has_eval_split`` nor has a ``split`` parameter. A factory taking ``**kwargs`` cannot be told
    apart without a call; ``make`` still raises for it. Imports the env's module, runs none of it."""
    if "split" not in kwargs:
        return
    s = _lookup(id)
    factory = load_entry_point(s.entry_point, s.id)
    declared = s.has_eval_split if s.has_eval_split is not None else getattr(factory, "has_eval_split", None)
    if declared is not None:
        return
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read
        return
    if "split" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    raise ConfigError(no_split_message(s.id, kwargs["split"]))


def _declares_no_split(s: EnvSpec, factory: Callable[..., Any]) -> bool:
    declared = s.has_eval_split if s.has_eval_split is not None else getattr(factory, "has_eval_split", None)
    return declared is False


def no_split_message(env_id: str, split: Any) -> str:
    """The ConfigError text for an env asked for ``split`` that neither takes it nor declares it has none."""
    return (
        f"env {env_id!r} was made with split={split!r} but takes no `split` keyword, so it has no held-out "
        "tasks to evaluate on. Either accept split='train'|'eval' and draw held-out tasks for 'eval', or declare "
        "that there are none (class attribute `has_eval_split = False`, or register(..., has_eval_split=False)): "
        "evaluation then runs on training-distribution tasks, with a warning. (`agentrl run` evaluates with "
        "eval.env_kwargs, {'split': 'eval'} by default.)"
    )


__all__ = [
    "EnvSpec",
    "GymEntry",
    "register",
    "make",
    "spec",
    "registered",
    "discover",
    "load_entry_point",
    "no_split_message",
    "check_split",
]
