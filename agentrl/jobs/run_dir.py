"""Whether a run directory may be used by a new ``agentrl run``: never silently on top of another run.

Owns what "holds a run" means (:data:`RUN_MARKERS`: the files and folders ``agentrl run`` writes
there: ``config.yaml``, ``metrics.jsonl``, ``summary.json``, ``checkpoints/``, ``ledger.jsonl``) and the
rule (:func:`prepare_run_dir`): a directory holding a run is used only with ``resume`` (continue it)
or ``overwrite`` (the old run is moved aside to ``DIR.old-N``, nothing is deleted); an empty, missing
or unrelated directory is used as it is.

Does not create the directory or write anything into it (``agentrl.jobs.run`` does) and does not
find checkpoints to resume from.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.errors import ConfigError

#: What ``agentrl run`` leaves in its directory; any one of them means the directory holds a run.
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints", "ledger.jsonl")


def run_markers(run_dir: str | Path) -> list[str]:
    """The :data:`RUN_MARKERS` present in ``run_dir`` (empty: it holds no run, or does not exist)."""
    p = Path(run_dir)
    if not p.is_dir():
        return []
    return [name for name in RUN_MARKERS if (p / name).exists()]


def set_aside_path(run_dir: str | Path) -> Path:
    """The first free ``DIR.old-N`` (N = 1, 2, ...) beside ``run_dir``."""
    p = Path(run_dir)
    n = 1
    while (p.parent / f"{p.name}.old-{n}").exists():
        n += 1
    return p.parent / f"{p.name}.old-{n}"


def prepare_run_dir(run_dir: str | Path, *, resume: bool, overwrite: bool) -> Path | None:
    """Apply the rule (module docstring) to ``run_dir`` before a run starts there.

    Returns where an overwritten run was moved (None when nothing moved). Raises ConfigError naming
    the directory and the way out when it holds a run and neither flag is set, or when both are."""
    p = Path(run_dir)
    if resume and overwrite:
        raise ConfigError(
            f"--resume and --overwrite contradict each other for run directory {str(p)!r}: "
            "--resume continues the run there, --overwrite sets it aside and starts afresh"
        )
    if p.exists() and not p.is_dir():
        raise ConfigError(f"run directory {str(p)!r} is a file, not a directory")
    found = run_markers(p)
    if not found or resume:
        return None
    if not overwrite:
        raise ConfigError(
            f"run directory {str(p)!r} already holds a run ({', '.join(found)}); "
            f"continue it with --resume, or start afresh with --overwrite (moves the old run to "
            f"{set_aside_path(p).name}), or choose another directory with --out"
        )
    dest = set_aside_path(p)
    try:
        p.rename(dest)
    except OSError as e:
        raise ConfigError(
            f"--overwrite: cannot move run directory {str(p)!r} to {str(dest)!r}: {e.strerror or e}"
        ) from None
    return dest
