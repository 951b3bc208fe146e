"""A directory in the cache built once: a lock per entry and an atomic rename into place.

Owns ``cached(dest, build)``: concurrent processes never see half an entry and never build it twice;
a failed build leaves nothing behind, and the temporary directory of a build that was killed (no
chance to clean up) is removed by the next build of the same entry, under its lock. Also ``lock``
(the ``flock`` it takes) and ``say`` (the one-line progress note on stderr). Used by the built-in
models (``agentrl.warmstart.model_cache`` re-exports these) and the GGUF conversion
(``agentrl.models.gguf``). Does not decide where entries live or what goes in them; an entry is
complete when its ``config.json`` exists (entries are HF model directories).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


@contextlib.contextmanager
def lock(path: Path):
    """An exclusive ``flock`` on ``path`` (created with its parents) for the ``with`` block."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached(dest: Path, build: Callable[[Path], None]) -> Path:
    """``dest``, built by ``build(tmp_dir)`` and renamed into place if missing (locked, atomic)."""
    if (dest / "config.json").exists():
        return dest
    with lock(dest.parent / f".{dest.name}.lock"):
        if (dest / "config.json").exists():  # another process built it while we waited
            return dest
        # Builders of this entry hold the lock, so a temporary directory seen now is a killed build's.
        for stale in dest.parent.glob(f".{dest.name}-*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        try:
            build(tmp)
            _usual_modes(tmp)
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest


def _umask() -> int:
    """The process umask, read without setting it (``os.umask`` would change it for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _usual_modes(root: Path) -> None:
    """The modes a plain ``mkdir``/``open`` would give under the umask: ``mkdtemp`` makes the entry
    0700 (and some writers make files 0600), which other users of a shared cache could not read."""
    umask = _umask()
    os.chmod(root, 0o777 & ~umask)
    for path in root.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def say(msg: str) -> None:
    print(f"agentrl: {msg}", file=sys.stderr, flush=True)
