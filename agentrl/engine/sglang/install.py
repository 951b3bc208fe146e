"""Installing the pinned SGLang release into its own virtualenv (``agentrl setup sglang``).

Owns: the pinned version (:data:`SGLANG_VERSION`), where the virtualenv lives
(``$AGENTRL_CACHE/sglang-venv``: SGLang pins its own torch, several GB with CUDA wheels, which must not
replace the project's), asking a virtualenv which sglang it has without importing it, and the install:
a no-op when the pinned version is there, else ``python -m venv`` then ``pip install sglang==VERSION`` in
it, every command's output streamed line by line and kept in a log file whose path every error names,
then one import of ``sglang`` to prove the install works.

Stdlib only (``agentrl.common.paths`` and ``agentrl.errors`` are too), so a checkout can run it before
agentrl's dependencies are installed: ``python3 -m agentrl.engine.sglang.install`` from the repository
root (what ``.ci/install_sglang.sh`` does). Does not retry (CI's ``.ci/run`` does), launch servers
(``agentrl.engine.sglang.server``) or delete a virtualenv.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrl.common.paths import cache_dir
from agentrl.errors import AgentRLError

#: The SGLang release agentrl is tested against (what :func:`install` puts in the virtualenv).
SGLANG_VERSION = "0.5.23"

#: Prints the installed sglang's version (exit 1 when there is none) without importing it: an import takes ~25 s.
VERSION_PROBE = (
    "import importlib.metadata as m, importlib.util as u, sys\n"
    "sys.exit('sglang not found') if u.find_spec('sglang') is None else print(m.version('sglang'))"
)
#: Proves a fresh install works: imports sglang (~25 s) and prints its version.
IMPORT_PROBE = "import sglang; print(sglang.__version__)"

#: runs a command, calling back with each line of its output (stdout and stderr merged); returns its exit code
Runner = Callable[[Sequence[str], Callable[[str], None]], int]


class InstallError(AgentRLError):
    """A step of the SGLang install failed; the message names the step, its exit code, pip's last error
    line and the log file."""


def venv_dir() -> Path:
    """Where SGLang's virtualenv lives: ``$AGENTRL_CACHE/sglang-venv`` (default ``~/.cache/agentrl``)."""
    return cache_dir() / "sglang-venv"


def venv_python(venv: Path | None = None) -> Path:
    """The python executable of SGLang's virtualenv (which may not exist)."""
    return (venv or venv_dir()) / "bin" / "python"


def log_file() -> Path:
    """The log of the latest install: next to the virtualenv, so it outlives a temporary directory."""
    return cache_dir() / "sglang-install.log"


def run_streaming(cmd: Sequence[str], on_line: Callable[[str], None]) -> int:
    """Run ``cmd``, passing each line of its output to ``on_line`` as it comes; its exit code (127 and a
    line saying why when it cannot be started)."""
    try:
        proc = subprocess.Popen(
            list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, bufsize=1
        )
    except OSError as e:
        on_line(f"cannot run {cmd[0]}: {e}")
        return 127
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
    return proc.wait()


def installed_version(python: Path | str, runner: Runner | None = None) -> str | None:
    """The sglang version ``python`` has installed, or None (no such python, no sglang)."""
    if not Path(python).exists():
        return None
    lines: list[str] = []
    rc = (runner or run_streaming)([str(python), "-c", VERSION_PROBE], lines.append)
    out = [ln.strip() for ln in lines if ln.strip()]
    return out[-1] if rc == 0 and out else None


@dataclass(frozen=True)
class Installed:
    """What :func:`install` found or did."""

    venv: Path
    version: str
    already: bool  # the pinned version was there: nothing was run
    seconds: float


def pip_command(python: Path | str, version: str = SGLANG_VERSION) -> list[str]:
    """The pip command that installs sglang ``version`` into the virtualenv of ``python``."""
    return [str(python), "-m", "pip", "install", "--progress-bar", "off", f"sglang=={version}"]


def _last_error(lines: Sequence[str]) -> str:
    """The line that says why a command failed: pip's last ``ERROR:`` line, else its last non-empty line."""
    text = [ln.strip() for ln in lines if ln.strip()]
    errors = [ln for ln in text if ln.startswith("ERROR:")]
    line = (errors or text or ["no output"])[-1]
    return line if len(line) <= 300 else line[:297] + "..."


def install(
    *,
    python: str | None = None,
    version: str = SGLANG_VERSION,
    venv: Path | None = None,
    log_path: Path | None = None,
    say: Callable[[str], None] = print,
    echo: Callable[[str], None] | None = None,
    runner: Runner | None = None,
) -> Installed:
    """Make sure the virtualenv ``venv`` (default :func:`venv_dir`) has sglang ``version``.

    ``python`` makes the virtualenv when it has to be created (default: this interpreter). ``say`` gets
    one line per phase, ``echo`` (if given) every line the commands print; everything also goes to
    ``log_path`` (default :func:`log_file`). ``runner`` runs the commands (tests pass a fake).
    Raises :class:`InstallError` naming the failed step and the log.
    """
    run = runner or run_streaming
    venv = Path(venv or venv_dir())
    py = venv_python(venv)
    t0 = time.monotonic()
    found = installed_version(py, run)
    if found == version:
        say(f"sglang {version} already installed in {venv}")
        return Installed(venv, version, True, time.monotonic() - t0)
    log_path = Path(log_path or log_file())
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if found:
        say(f"{venv} has sglang {found}; installing the pinned {version}")
    say(f"installing sglang {version} into {venv} (log: {log_path})")
    with open(log_path, "w", encoding="utf-8") as log:

        def step(what: str, cmd: Sequence[str]) -> list[str]:
            lines: list[str] = []

            def on_line(line: str) -> None:
                lines.append(line)
                log.write(line + "\n")
                log.flush()
                if echo is not None:
                    echo(line)

            log.write(f"=== {what}: {' '.join(cmd)}\n")
            log.flush()
            rc = run(cmd, on_line)
            if rc != 0:
                raise InstallError(f"{what} failed (exit {rc}): {_last_error(lines)}; full log: {log_path}")
            return lines

        base = python or sys.executable
        if py.exists():
            say(f"[1/3] reusing the virtualenv {venv}")
        else:
            say(f"[1/3] creating the virtualenv {venv} with {base}")
            step(f"creating the virtualenv {venv} with {base}", [base, "-m", "venv", str(venv)])
        say(f"[2/3] pip install sglang=={version} (its own torch: several GB, minutes on a first install)")
        step(f"pip install sglang=={version} into {venv}", pip_command(py, version))
        say("[3/3] checking that sglang imports (~25 s)")
        out = [ln.strip() for ln in step(f"importing sglang from {py}", [str(py), "-c", IMPORT_PROBE]) if ln.strip()]
        got = out[-1] if out else "?"
        if got != version:
            raise InstallError(f"{venv} imports sglang {got}, not the pinned {version}; full log: {log_path}")
    seconds = time.monotonic() - t0
    say(f"sglang {version} installed in {venv} in {seconds:.0f} s")
    return Installed(venv, version, False, seconds)


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m agentrl.engine.sglang.install [--python PY] [--quiet]``: :func:`install`, for a
    checkout whose dependencies are not installed yet (CI); exit 1 with one ``error:`` line on failure."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python3 -m agentrl.engine.sglang.install",
        description="Install the pinned SGLang into $AGENTRL_CACHE/sglang-venv (what `agentrl setup sglang` does).",
    )
    p.add_argument("--python", help="interpreter that creates the virtualenv (default: this one)")
    p.add_argument("--quiet", "-q", action="store_true", help="one line per phase, not pip's output")
    args = p.parse_args(argv)
    try:
        install(python=args.python, say=lambda s: print(s, flush=True), echo=None if args.quiet else _indented)
    except InstallError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


def _indented(line: str) -> None:
    print("    " + line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
