"""The config options every ``agentrl`` command shares: ``-c/--config FILE`` and ``--set a.b=c``.

Owns the one definition of both options (each command declares ``config: ... = ConfigOpt`` and
``sets: ... = SetOpt``; nothing is copied per command), loading them into the one config tree
(:func:`load`), telling which dotted fields the user named (:func:`named`, so a command with its
own defaults lets a named field win over them and a flag win over both), and the refusal of a
command that has no use for a config (:func:`refuse`).

Does not define the tree, merge layers or check values (``agentrl.config.schema``) nor decide what a
command does with a field (each command's module says which fields it reads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from agentrl.errors import ConfigError

ConfigOpt = typer.Option(
    None, "--config", "-c", help="YAML config file(s), merged in order (see configs/; repeatable)."
)
SetOpt = typer.Option(
    None,
    "--set",
    "-s",
    help="Override a config field by its dotted name: --set rollout.group_size=8 "
    "(repeatable; `agentrl config --docs` lists every field).",
)


def load(config: list[str] | None, sets: list[str] | None, base: dict | None = None):
    """The ``RunConfig`` of defaults <- ``base`` <- the ``-c`` files <- the ``--set`` items, validated
    (a ConfigError names the file, the field and the bad value)."""
    from agentrl.config.schema import load_config  # lazy: keeps CLI start light

    return load_config(config or [], sets or [], base=base or {})


def named(config: list[str] | None, sets: list[str] | None) -> set[str]:
    """Every dotted field name the ``-c`` files and ``--set`` items give a value, parents included
    (``{"rollout", "rollout.seed"}`` for ``--set rollout.seed=3``). Call after :func:`load` has
    accepted the same arguments, so every file here is known to be readable."""
    # lazy: keeps CLI start light; the loader's own readers: same errors
    from agentrl.config.schema import _read_file, parse_override

    layers = [_read_file(Path(f)) for f in config or []] + [parse_override(s) for s in sets or []]
    out: set[str] = set()
    for layer in layers:
        out |= set(_dotted(layer))
    return out


def _dotted(data: dict, prefix: str = ""):
    for key, value in data.items():
        name = f"{prefix}{key}"
        yield name
        if isinstance(value, dict):
            yield from _dotted(value, name + ".")


def field(cfg: Any, dotted: str) -> Any:
    """The value of the dotted field ``dotted`` of a loaded config."""
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def pick(flag: Any, cfg: Any, dotted: str, given: set[str], default: Any = None) -> Any:
    """A command's value for one setting: the flag when it was given (not None), else the config
    field when the files or ``--set`` named it, else the command's own ``default``."""
    if flag is not None:
        return flag
    if dotted in given:
        return field(cfg, dotted)
    return default


def refuse(command: str, config: list[str] | None, sets: list[str] | None, why: str) -> None:
    """ConfigError when a command that reads no config field was given ``-c`` or ``--set``."""
    if config or sets:
        given = ", ".join([*(f"-c {c}" for c in config or []), *(f"--set {s}" for s in sets or [])])
        raise ConfigError(f"`agentrl {command}` takes no config ({given}): {why}")
