"""Checkpoint integrity: what is written with a checkpoint to prove it whole, how ``--resume`` picks one,
and what a failed save leaves behind.

Owns ``MANIFEST.json`` (every file's size and sha256, written into ``step_N.tmp`` just before the
``COMPLETE`` marker), :func:`layout_gap` (the first file loading a checkpoint needs that is not there:
cheap, and the only check a checkpoint without a manifest gets), :func:`verify` (marker, then sizes,
then the layout, then checksums), :func:`pick_resume` (the
newest checkpoint that verifies; each newer one skipped is reported with its reason, and a run whose
every checkpoint is broken stops instead of silently starting over) and :func:`failed_save_cleanup`
(a save that fails removes its ``.tmp`` and never touches an earlier checkpoint; running out of disk
is reported as such, whatever the writer's own message, e.g. torch's ``unexpected pos``).

Does not: write or load the trainer state (``agentrl.trainer.checkpoint``), decide when to save
(the run loop), or rewind the run's logs (``agentrl.batches.ledger.rewind``, called with the chosen step).
Torch-free, so a reader of run directories can use it cheaply.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from agentrl.errors import CheckpointError

MARKER = "COMPLETE"
MANIFEST = "MANIFEST.json"
STATE = "trainer_state.json"
_STEP = re.compile(r"step_(\d+)")
# How writers report a full disk: errno 28 in OSError or in a Rust/C++ error's text (safetensors),
# torch's zip writer's failed seek ("unexpected pos"), its short write ("file write failed")
_FULL_TEXT = re.compile(r"No space left|StorageFull|unexpected pos|file write failed|Disk quota", re.I)
_LOW_FREE = 1 << 20  # bytes: a failing write on a file system this full ran out of space


def _sha256(f: Path) -> str:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(d: Path) -> list[Path]:
    return sorted(f for f in d.rglob("*") if f.is_file() and f.name not in (MARKER, MANIFEST))


def write_manifest(d: Path) -> None:
    """Record the size and sha256 of every file now in ``d`` (call last before the marker)."""
    files = {f.relative_to(d).as_posix(): {"size": f.stat().st_size, "sha256": _sha256(f)} for f in _files(d)}
    (d / MANIFEST).write_text(json.dumps({"version": 1, "files": files}, indent=1))


def _shards(d: Path) -> list[str]:
    index = d / "model.safetensors.index.json"
    if not index.is_file():
        return ["model.safetensors"]
    return sorted(set(json.loads(index.read_text())["weight_map"].values()))


def layout_gap(d: Path) -> str | None:
    """Why ``agentrl.trainer.checkpoint.load`` could not read checkpoint ``d`` — the first file it
    needs that is missing (``STATE`` says which: the policy's weights or its adapters, one RNG state
    per rank of the saving run, the critic's files if it had one) — or None. Names and presence only,
    no checksums: what a checkpoint without a manifest (or with its manifest deleted) is checked by."""
    if not (d / STATE).is_file():
        return f"{STATE} is missing"
    try:
        state = json.loads((d / STATE).read_text())
        world, lora = int(state["world_size"]), int(state.get("lora_rank", 0))
        # written since the critic flag existed; before, a critic/ folder is the only sign of one
        critic = bool(state.get("critic", (d / "critic").is_dir()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{STATE} is unreadable ({type(e).__name__}: {e})"
    try:
        policy = ["adapter/adapter_config.json", "adapter/adapter_model.safetensors"] if lora else _shards(d)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"model.safetensors.index.json is unreadable ({type(e).__name__}: {e})"
    need = [*policy, "optimizer.pt", "scheduler.pt", *(f"rng/rank{r}.pt" for r in range(world))]
    if critic:
        need += ["critic/critic.safetensors", "critic/optimizer.pt", "critic/scheduler.pt"]
    for rel in need:
        if not (d / rel).is_file():
            return f"{rel} is missing"
    return None


def verify(d: Path) -> str | None:
    """Why checkpoint ``d`` cannot be resumed from, or None if it verifies. A checkpoint without a
    manifest (written before manifests existed, or its manifest lost) is checked by its layout alone."""
    if not (d / MARKER).is_file():
        return f"no {MARKER} marker (its save did not finish)"
    if not (d / MANIFEST).is_file():
        return layout_gap(d)
    try:
        files = json.loads((d / MANIFEST).read_text())["files"]
        sizes = {rel: int(meta["size"]) for rel, meta in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{MANIFEST} is unreadable ({e})"
    for rel, size in sizes.items():  # sizes first: cheap, and a truncation is the common damage
        f = d / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != size:
            return f"{rel} is {f.stat().st_size} bytes, its manifest says {size} (truncated or overwritten)"
    if gap := layout_gap(d):  # a needed file the manifest does not list is missing all the same
        return gap
    for rel, meta in files.items():
        if _sha256(d / rel) != meta.get("sha256"):
            return f"{rel} does not match its sha256 checksum (corrupted)"
    return None


def _say(msg: str) -> None:
    print(f"agentrl: {msg}", file=sys.stderr, flush=True)


def pick_resume(ckpt_dir: Path, note: Callable[[str], None] = _say) -> Path | None:
    """The newest checkpoint under ``ckpt_dir`` that verifies; None if there is no checkpoint at all.
    Each newer one is skipped with a note saying why; CheckpointError if every one is broken.
    Only ``step_N`` directories count: ``step_N.tmp`` (being written) and ``step_N.old`` (being
    replaced) are never resumed from."""
    steps = sorted(
        ((int(m.group(1)), p) for p in Path(ckpt_dir).glob("step_*") if p.is_dir() and (m := _STEP.fullmatch(p.name))),
        reverse=True,
    )
    skipped = []
    for _, d in steps:
        reason = verify(d)
        if reason is None:
            return d
        skipped.append(f"{d.name}: {reason}")
        note(f"--resume: skipped checkpoint {d}: {reason}")
    if skipped:
        raise CheckpointError(f"--resume: no usable checkpoint in {ckpt_dir}: " + "; ".join(skipped))
    return None


def out_of_space(e: BaseException, where: Path) -> bool:
    """Did writing under ``where`` fail because its file system is full?"""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if _FULL_TEXT.search(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return isinstance(e, (OSError, RuntimeError)) and shutil.disk_usage(where).free < _LOW_FREE
    except OSError:
        return False


@contextlib.contextmanager
def failed_save_cleanup(tmp: Path, final: Path) -> Iterator[None]:
    """Around the writes of checkpoint ``final`` into ``tmp``: on failure remove ``tmp`` (earlier
    checkpoints are untouched: nothing is renamed before the marker), and report a full disk as
    CheckpointError naming the checkpoint instead of the writer's own message."""
    try:
        yield
    except BaseException as e:
        full = out_of_space(e, tmp.parent)  # before the removal frees the space again
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise CheckpointError(
                f"no space left on device while writing checkpoint {final} ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:160]}); the partial save was removed and earlier checkpoints are "
                "intact: free some space and continue with --resume"
            ) from e
        raise
