"""How the ``agentrl`` command line reports a failure: one line, an exit code, no traceback.

Owns the global ``--debug`` switch (or ``AGENTRL_DEBUG=1``), :func:`fail` (every command's ``except
AgentRLError`` ends in it) and :class:`ErrorGroup`, the click group of the ``agentrl`` app, which
catches what escapes any command, sub-apps included: an ``AgentRLError`` (a bad input, named by its
message) prints ``error: <message>`` and exits 2; any other exception is a bug and prints ``error:
internal error (Type: message)`` and exits 1. Under ``--debug`` both raise, so the traceback shows.

Does not decide what a bad input is: the config loader, dataset reader, model-directory check and
the commands raise ``AgentRLError`` subclasses naming the file, field or row.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from agentrl.errors import AgentRLError

_state = {"debug": False}


def _click_flow() -> tuple[type[BaseException], ...]:
    """The exceptions click (and typer's vendored copy of click, typer >= 0.20) uses for usage errors and
    exits: they print their own message and exit code, so they pass through untouched."""
    out: list[type[BaseException]] = [click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort]
    out.append(typer.Exit)
    vendored = getattr(getattr(typer, "_click", None), "exceptions", None)
    for name in ("ClickException", "Exit", "Abort"):
        cls = getattr(vendored, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            out.append(cls)
    return tuple(out)


_CLICK_FLOW = _click_flow()


def set_debug(on: bool) -> None:
    _state["debug"] = bool(on) or os.environ.get("AGENTRL_DEBUG", "") not in ("", "0")


def debug() -> bool:
    return _state["debug"]


def _say(text: str) -> None:
    # stderr, unwrapped: a long path must not break the one line into several; the message is
    # escaped because a bad value such as "[x]" is not rich markup
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(text)}", highlight=False)


def fail(e: BaseException, code: int = 2) -> NoReturn:
    """Report ``e`` as one line and exit ``code`` (re-raise it under ``--debug``)."""
    if debug():
        raise e
    _say(" ".join(str(e).split()) or type(e).__name__)
    raise typer.Exit(code)


class ErrorGroup(TyperGroup):
    """The top-level click group: turns an exception escaping a command into one line (see module doc)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except _CLICK_FLOW:
            raise
        except AgentRLError as e:
            fail(e)
        except RecursionError as e:  # a bad input the checks missed; not a bug in the traceback sense
            fail(AgentRLError(f"input nested too deeply to process ({e})"))
        except Exception as e:  # noqa: BLE001 - a bug: one line, the traceback under --debug
            if debug():
                raise
            first = (str(e).strip().splitlines() or [""])[0][:300]
            _say(f"internal error ({type(e).__name__}: {first}); rerun with --debug for the traceback")
            sys.stderr.flush()
            raise typer.Exit(1) from None
