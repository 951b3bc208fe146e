"""Building a cached model directory once: a lock per entry and an atomic rename into place.

Owns ``cached(dest, build)`` (concurrent runs never see half a model and never build it twice; a
failed build leaves nothing behind), ``say`` (the one-line progress note on stderr) and
``sft_progress`` (an SFT build's step and loss, said every so many steps). Used by the built-in models
(``agentrl.warmstart.default_model``, ``textworld_model``, ``textworld_practice``); does not decide
where entries live or what goes in them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
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
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        try:
            build(tmp)
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest


def say(msg: str) -> None:
    print(f"agentrl: {msg}", file=sys.stderr, flush=True)


def sft_progress(label: str, steps: int, every: int = 100) -> Callable[[int, dict], None]:
    """A ``run_sft`` ``log`` callback for a long first-use build: says ``label``, the step, the loss and
    the seconds since it was made, every ``every`` steps and at the last."""
    t0 = time.perf_counter()

    def progress(step: int, metrics: dict) -> None:
        if step % every == 0 or step == steps:
            say(f"{label}, step {step}/{steps}, loss {metrics['loss']:.3f}, {time.perf_counter() - t0:.0f} s")

    return progress
