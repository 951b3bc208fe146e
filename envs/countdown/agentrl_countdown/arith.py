"""Exact arithmetic over a model's expression: ``evaluate`` (``+ - * /`` and parentheses on integer
literals, as a ``Fraction``; anything else is refused) and ``numbers_used`` (the literals it uses).
Never calls ``eval``: the expression is parsed with ``ast`` and walked."""

from __future__ import annotations

import ast
from fractions import Fraction

MAX_CHARS = 200  # longer expressions are refused before parsing
MAX_LITERAL = 10**6

_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class ArithError(ValueError):
    """The expression is not plain integer arithmetic, or divides by zero; the message says why."""


def _parse(expr: str) -> ast.expr:
    if len(expr) > MAX_CHARS:
        raise ArithError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        return ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        raise ArithError(f"not an arithmetic expression: {expr!r}") from None


def _walk(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= MAX_LITERAL:
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ArithError("division by zero")
        return _OPS[type(node.op)](left, right)
    raise ArithError("only whole numbers, + - * / and parentheses are allowed")


def evaluate(expr: str) -> Fraction:
    """The exact value of ``expr``; raises :class:`ArithError` on anything but integer arithmetic."""
    return _walk(_parse(expr))


def numbers_used(expr: str) -> list[int]:
    """The integer literals of ``expr``, in order (``expr`` must :func:`evaluate`)."""
    tree = _parse(expr)
    _walk(tree)
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
