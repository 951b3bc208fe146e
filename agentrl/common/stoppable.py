"""Awaiting something unless a stop comes first.

Owns :func:`unless_stopped`: the run loop's way to wait for a batch, an eval or anything else that a
stop request (SIGTERM, ``Runner.request_stop``) must not wait for. Owns nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def unless_stopped(aw: Awaitable[T], stop: asyncio.Event) -> tuple[bool, T | None]:
    """``(True, result)`` once ``aw`` finishes, or ``(False, None)`` if ``stop`` is set first; ``aw``
    is then cancelled and awaited (its cleanup runs before this returns). ``aw``'s own error is
    raised. If both are ready together, the result wins: finished work is never thrown away."""
    work = asyncio.ensure_future(aw)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not work.done():
            work.cancel()
        await asyncio.gather(work, stopped, return_exceptions=True)
    if work.cancelled():
        return False, None
    return True, work.result()
