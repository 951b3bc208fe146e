"""Take the documentation's pictures from the real program, so they do not go stale silently.

    python tools/screenshots.py                      # a short run's log and `agentrl doctor`
    python tools/screenshots.py --run runs/code_exec-grpo   # also the report of README command 1's run
    python tools/screenshots.py --site OUT           # also PNGs of the built site's home and config reference

Writes ``docs/img/run-log.svg`` (the lines a short ``agentrl run`` prints off a terminal, one per step and
eval), ``docs/img/doctor.svg`` (``agentrl doctor`` on this machine), with ``--run`` ``docs/report.png``
(``agentrl report --screenshot`` of that run: pass the default run's directory, so the picture shows the whole
recipe), and with ``--site`` the site's pages rendered by headless Chromium (``mkdocs build`` first). Terminal
output becomes SVG through rich's own export, so text stays text.

Needs headless Chromium for the PNGs (``apt-get install chromium-headless-shell``) and the docs extra for
``--site``. Does not: commit anything, or run inside the docs build (a short run takes minutes).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
SHORT_RUN = ["--steps", "6", "--set", "eval.num_tasks=64", "--set", "eval.every=3", "--set", "train.groups_per_step=8"]


def agentrl(*args: str, cwd: Path = ROOT, columns: int = 140) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in the order a reader sees it
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"agentrl {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    # transformers' own weight-loading bars are not agentrl's output
    return "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("Loading weights"))


def terminal_svg(text: str, path: Path, title: str, width: int = 140) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(record=True, width=width, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(Text.from_ansi(text.strip("\n")))
    path.parent.mkdir(parents=True, exist_ok=True)
    console.save_svg(str(path), title=title)
    print(f"wrote {path.relative_to(ROOT)}")


def site_pages(out: Path) -> None:
    from agentrl.cli.report import screenshot

    with tempfile.TemporaryDirectory() as site:
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", site], cwd=ROOT, check=True)
        out.mkdir(parents=True, exist_ok=True)
        for page, name in (("index.html", "site-home.png"), ("reference/config/index.html", "site-config.png")):
            screenshot(Path(site) / page, out / name, width=1280, height=1400)
            print(f"wrote {out / name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="a run directory whose report becomes docs/report.png")
    ap.add_argument("--site", type=Path, help="also write PNGs of the built site's pages into this directory")
    args = ap.parse_args()
    short = Path(tempfile.mkdtemp(prefix="agentrl-docs-run-")) / "run"
    log = agentrl("run", "--env", "code_exec", "--algo", "grpo", "-o", str(short), *SHORT_RUN)
    terminal_svg(log, IMG / "run-log.svg", "agentrl run, off a terminal: one line per step and eval")
    if args.run:
        from agentrl.cli.report import screenshot

        agentrl("report", str(args.run))
        screenshot(args.run / "report.html", ROOT / "docs" / "report.png")
        print("wrote docs/report.png")
    terminal_svg(agentrl("doctor"), IMG / "doctor.svg", "agentrl doctor")
    if args.site:
        site_pages(args.site)


if __name__ == "__main__":
    main()
