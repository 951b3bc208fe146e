"""``agentrl report RUN_DIR``: write the run's static HTML report (see agentrl.observe.report), optionally a
PNG screenshot of it taken with headless Chromium when one is installed."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Optional

import typer

CHROMIUMS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUMS) if p), None)


def screenshot(html_path: Path, png_path: Path, *, width: int = 1280, height: int = 2400, timeout_s: float = 120) -> Path:
    """Render ``html_path`` in headless Chromium to ``png_path``; RuntimeError naming the reason if it cannot."""
    exe = find_chromium()
    if exe is None:
        raise RuntimeError(f"no headless Chromium found (looked for {', '.join(CHROMIUMS)}); "
                           "on Debian: apt-get install chromium-headless-shell")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},{height}",
           f"--screenshot={png_path}", html_path.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not png_path.exists():
        raise RuntimeError(f"{exe} failed (exit {proc.returncode}): {proc.stderr[-500:]}")
    return png_path


def report_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory (what `agentrl run` wrote)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="HTML file to write (default RUN_DIR/report.html)."),
    png: Optional[Path] = typer.Option(None, "--screenshot", help="Also save a PNG of the page (needs headless Chromium)."),
    max_trajectories: int = typer.Option(24, help="Newest saved trajectories shown in the token viewer."),
) -> None:
    """Write a static HTML report of a run: curves, monitors, outcomes, token-level trajectory viewer."""
    from rich.console import Console

    from agentrl.observe.report import write_report

    console = Console()
    try:
        path = write_report(run_dir, out, max_trajectories=max_trajectories)
    except FileNotFoundError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2)
    console.print(f"report: {path}")
    if png:
        try:
            console.print(f"screenshot: {screenshot(path, png)}")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            console.print(f"[red]screenshot failed:[/] {e}")
            raise typer.Exit(1)
