"""This process's memory: what it holds now and at its peak, and handing freed memory back.

Owns ``rss_gb`` (resident set now, from ``/proc/self/statm``), ``peak_rss_gb`` (the kernel's
high-water mark, ``ru_maxrss``), ``tune_allocator`` (glibc's malloc limited to a few arenas) and
``release`` (glibc's free memory handed back to the system).

Why the allocator needs telling: a training run frees and re-allocates tensors of many sizes from
several threads (engine, trainer, sandbox I/O). glibc keeps freed memory in up to 8 x cores
per-thread arenas and, after each large free, serves ever larger blocks from those heaps instead
of ``mmap``, so a run's resident set kept growing step after step on memory it no longer used.
Capping the arenas (``tune_allocator``, before the worker threads start) and trimming the heaps
once a step (``release``: ``malloc_trim``, a few milliseconds) stop that growth without making
every large tensor a fresh ``mmap`` (a fixed ``MALLOC_MMAP_THRESHOLD_`` does that and slowed the
trainer). A ``MALLOC_ARENA_MAX`` in the environment is kept.

Does not: measure child processes (SGLang servers, Ray workers, sandboxes report their own), or
tune other allocators (jemalloc/tcmalloc preloaded by the user are left alone: ``mallopt`` is
glibc's, and absent elsewhere it does nothing).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import resource
import sys

GB = 1 << 30
ARENA_MAX = 2
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)


def rss_gb() -> float:
    """Resident memory of this process now, in GB (0.0 where ``/proc`` is absent)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GB
    except (OSError, ValueError, IndexError):
        return 0.0


def peak_rss_gb() -> float:
    """The most resident memory this process has held, in GB (``ru_maxrss``: KB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / GB if sys.platform == "darwin" else peak * 1024 / GB


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    # both are glibc's; musl and others lack them
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def tune_allocator() -> bool:
    """Keep glibc's malloc to ``ARENA_MAX`` arenas (threads started later share them). False when
    not glibc or when the environment sets ``MALLOC_ARENA_MAX`` already."""
    libc = _glibc()
    return libc is not None and "MALLOC_ARENA_MAX" not in os.environ and libc.mallopt(_M_ARENA_MAX, ARENA_MAX) == 1


def release() -> None:
    """Hand the free memory of glibc's heaps back to the system (nothing elsewhere)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
