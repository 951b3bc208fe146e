"""``agentrl report RUN_DIR``: write the run's static HTML report (see agentrl.observe.report), optionally a
PNG screenshot of it taken with headless Chromium when one is installed.

``-c/--set`` are the run config whose ``monitor.*`` thresholds the report checks the run's metrics
against, laid over the run's own (its ``config.yaml``): ``--set monitor.kl_spike_factor=2`` asks
"would a stricter monitor have alerted?". Without RUN_DIR the config's ``output_dir`` is reported.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import typer

from agentrl.cli.errors import fail
from agentrl.cli.options import ConfigOpt, SetOpt, load, named, pick
from agentrl.errors import AgentRLError

CHROMIUMS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUMS) if p), None)


def screenshot(
    html_path: Path, png_path: Path, *, width: int = 1280, height: int = 2400, timeout_s: float = 120
) -> Path:
    """Render ``html_path`` in headless Chromium to ``png_path``; RuntimeError naming the reason if it cannot."""
    exe = find_chromium()
    if exe is None:
        raise RuntimeError(
            f"no headless Chromium found (looked for {', '.join(CHROMIUMS)}); "
            "on Debian: apt-get install chromium-headless-shell"
        )
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--screenshot={png_path}",
        html_path.resolve().as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not png_path.exists():
        raise RuntimeError(f"{exe} failed (exit {proc.returncode}): {proc.stderr[-500:]}")
    return png_path


def report_cmd(
    run_dir: Path | None = typer.Argument(
        None, help="A run directory (what `agentrl run` wrote); default: the config's output_dir."
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="HTML file to write (default RUN_DIR/report.html)."),
    png: Path | None = typer.Option(
        None, "--screenshot", help="Also save a PNG of the page (needs headless Chromium)."
    ),
    max_trajectories: int = typer.Option(24, help="Newest saved trajectories shown in the token viewer."),
    config: list[str] | None = ConfigOpt,
    sets: list[str] | None = SetOpt,
) -> None:
    """Write a static HTML report of a run: curves, monitors, outcomes, token-level trajectory viewer."""
    from rich.console import Console

    from agentrl.observe.report import write_report  # lazy: keeps CLI start light

    console = Console()
    try:
        run_dir, monitor = settings(config, sets, run_dir)
        path = write_report(run_dir, out, max_trajectories=max_trajectories, monitor=monitor)
    except AgentRLError as e:
        fail(e)
    except FileNotFoundError as e:
        fail(AgentRLError(str(e)))
    console.print(f"report: {path}")
    if png:
        try:
            console.print(f"screenshot: {screenshot(path, png)}")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            console.print(f"[red]screenshot failed:[/] {e}")
            raise typer.Exit(1) from None


def settings(config: list[str] | None, sets: list[str] | None, run_dir: Path | None):
    """(run dir, monitor thresholds or None for the run's own): RUN_DIR, else the config's named
    ``output_dir``; the thresholds are the run's ``monitor`` section under the ``-c/--set`` layers."""
    cfg = load(config, sets)
    run_dir = pick(run_dir, cfg, "output_dir", named(config, sets))
    if run_dir is None:
        raise AgentRLError("report needs a run: RUN_DIR, or a config naming output_dir")
    if not (config or sets):
        return Path(run_dir), None
    return Path(run_dir), load(config, sets, {"monitor": _run_monitor(Path(run_dir))}).monitor


def _run_monitor(run_dir: Path) -> dict:
    """The ``monitor`` section of the run's config.yaml, its known fields ({} when it has none or
    cannot be read: the report itself says what is missing)."""
    import yaml

    from agentrl.observe.monitors import MonitorConfig  # lazy: keeps CLI start light

    try:
        data = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    section = data.get("monitor") if isinstance(data, dict) else None
    known = set(MonitorConfig.__dataclass_fields__)
    return {k: v for k, v in section.items() if k in known} if isinstance(section, dict) else {}
