"""Parsing user-supplied structured text (YAML config files, ``--set`` values, JSON dataset rows) into
values that are safe to use, or one readable reason why not.

Owns the limits on such input — nesting depth (``MAX_DEPTH``) and finite numbers — and
:func:`parse_text`, which turns the parsers' own failure modes on hostile input (``RecursionError``
on deep nesting, ``ValueError`` on a >4,300-digit integer, ``UnicodeDecodeError`` on binary bytes)
into :class:`BadText` with a message a user can act on. Callers add the file, field or row.

Does not: know any schema (``agentrl.config.schema`` and ``agentrl.envs.datasets`` validate the values).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: Deepest nesting of lists/mappings accepted anywhere a user hands us data. Real configs and rows
#: are a few levels deep; the parsers and every recursive walk after them (merge, dump, JSON) fail
#: near 1,000, so the cut-off sits well below that.
MAX_DEPTH = 100


class BadText(ValueError):
    """The text cannot be used; the message says why (without saying where: the caller knows)."""


def depth_error(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """A reason if ``value`` nests lists/tuples/dicts deeper than ``limit`` levels; iterative, so a
    deep value cannot overflow the stack while it is measured."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        if d > limit:
            return f"nested deeper than {limit} levels"
        stack.extend((c, d + 1) for c in children)
    return None


def finite_error(value: Any) -> str | None:
    """A reason if ``value`` is a float that is NaN or infinite."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    return None


def decode(data: bytes) -> str:
    """UTF-8 text (a leading byte-order mark dropped, as editors on Windows write one)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadText(f"not UTF-8 text (byte {e.start} is {data[e.start : e.start + 1]!r}; a binary file?)") from None


def parse_text(text: str, parser: Callable[[str], Any]) -> Any:
    """``parser(text)`` with its failures on hostile input turned into ``BadText``; the result is
    also checked for depth. Syntax errors of the parser itself propagate unchanged."""
    try:
        value = parser(text)
    except RecursionError:
        raise BadText(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        if "integer string conversion" in str(e):  # CPython's guard against quadratic int parsing
            raise BadText("a number has more than 4,300 digits") from None
        raise
    reason = depth_error(value)
    if reason:
        raise BadText(reason)
    return value
