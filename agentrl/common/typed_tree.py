"""Typed dataclass trees from plain data: the parsing rules every agentrl config section shares.

Owns: coercing a loaded value to a field's type (``Literal``, unions, nested dataclasses; every
float finite, every int within 64 bits), the ``min``/``max`` range checks of ``doc()`` fields,
rejecting unknown keys (``build``), merging layers of plain data (``deep_merge``) and reading one
``--set a.b=c`` override (``parse_override``). Each error is a ConfigError naming the dotted field
and the bad value. Does not know any config class (``agentrl.config.schema`` holds the run's tree,
``agentrl.warmstart.sft`` the SFT stage's) nor any cross-field rule (``agentrl.config.plan``).
"""

from __future__ import annotations

import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Literal, get_args, get_origin

import yaml

from agentrl.common.bounded import BadText, finite_error, parse_text
from agentrl.errors import ConfigError


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, path: str) -> Any:
    """``value`` as type ``tp`` (the field at dotted ``path``), or ConfigError naming both."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{path}: {value!r} is not one of {list(get_args(tp))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, path)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{path}: bad value {value!r}")
    if isinstance(tp, type) and is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return build(tp, value, path)
    base = origin or tp
    if base is float and not isinstance(value, bool) and isinstance(value, (int, float, str)):
        return finite(value, path)
    if base is bool and not isinstance(value, bool):
        raise ConfigError(f"{path}: expected true/false, got {value!r}")
    if (
        base in (int, float, str, dict, list)
        and not isinstance(value, base)
        or (base is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{path}: expected {_type_name(base)}, got {value!r} ({type(value).__name__})")
    # numpy seeds, torch sizes and rlimits stop at 64 bits
    if base is int and isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise ConfigError(f"{path}: {value} is too large (more than 64 bits)")
    return value


def finite(value: int | float | str, path: str) -> float:
    """A float field's value: ints and YAML 1.1's unquoted "1e-4" (a string) accepted; NaN and
    infinities rejected, as every float of a config (rates, temperatures, timeouts) must be finite."""
    try:
        out = float(value)
    except ValueError:
        raise ConfigError(f"{path}: expected float, got {value!r} (str)") from None
    except OverflowError:  # an int beyond float range
        raise ConfigError(f"{path}: a {len(str(value))}-digit number is out of float range (must be finite)") from None
    reason = finite_error(out)
    if reason:
        shown = repr(value) if len(str(value)) < 40 else f"a {len(str(value))}-character number"
        raise ConfigError(f"{path}: {shown} is not a finite number")
    return out


def build(cls: type, data: dict, prefix: str = "") -> Any:
    """An instance of dataclass ``cls`` from ``data`` (missing keys keep their defaults)."""
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = prefix or "config"
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(names)}")
    kwargs = {}
    for name, value in data.items():
        path = f"{prefix}.{name}" if prefix else name
        f = names[name]
        v = coerce(value, hints[name], path)
        lo, hi = f.metadata.get("min"), f.metadata.get("max")
        if lo is not None and isinstance(v, (int, float)) and v < lo:
            raise ConfigError(f"{path}: {v!r} is below the minimum {lo}")
        if hi is not None and isinstance(v, (int, float)) and v > hi:
            raise ConfigError(f"{path}: {v!r} is above the maximum {hi}")
        kwargs[name] = v
    return cls(**kwargs)


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` laid on ``base``: a mapping merges into the mapping below it key by key, at every
    depth (so ``--set env.kwargs.a=1 --set env.kwargs.b=2`` keeps both); an empty mapping ``{}``
    clears what is below it (the one way to drop keys a lower layer set); any other value replaces."""
    out = dict(base)
    for k, v in over.items():
        below = out.get(k)
        out[k] = deep_merge(below, v) if isinstance(v, dict) and v and isinstance(below, dict) else v
    return out


def parse_override(item: str) -> dict:
    """``a.b=c`` -> {"a": {"b": c}} with c parsed as YAML (so 3 is an int, [1,2] a list)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. rollout.group_size=8")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {key!r}: empty field name in the key (expected e.g. rollout.group_size)")
    try:
        value = parse_text(raw, yaml.safe_load) if raw != "" else ""
    except BadText as e:
        raise ConfigError(f"--set {key}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {short(item)!r}: cannot parse value: {one_line(e)}") from None
    out: dict = {}
    cur = out
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} chars)"


def one_line(e: Exception) -> str:
    return " ".join(str(e).split())
