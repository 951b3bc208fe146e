"""`agentrl sft`: the supervised warm start as a command (registered on the main app by agentrl.cli.main).

Owns the command's arguments and its summary table; everything it runs is ``agentrl.warmstart.sft``.
"""
from __future__ import annotations

import sys
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from agentrl.cli.errors import fail
from agentrl.errors import AgentRLError

console = Console()


def sft_cmd(
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="Local HF model dir to fine-tune; default: the built-in tiny model before its warm start."),
    data: Optional[List[str]] = typer.Option(None, "--data", "-d",
                                             help="Chat JSONL file(s): rows {\"messages\": [...], \"tools\": [...]} (repeatable)."),
    out: str = typer.Option("runs/sft", "--out", "-o", help="Where the fine-tuned HF model directory is written."),
    steps: Optional[int] = typer.Option(None, "--steps", "-n", help="Optimizer steps (sft.steps)."),
    sets: Optional[List[str]] = typer.Option(None, "--set", "-s",
                                             help="Override an SFT field: --set lr=1e-3 (repeatable; `--set help=1` lists them)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Fine-tune on oracle tool-use demonstrations of code_exec and/or your chat JSONL.

    With --data, demonstrations are off unless you --set num_demos=N; without it, the default
    warm-start recipe of the built-in model is used."""
    from agentrl.warmstart.sft import SFTConfig, build_sft_config, run_sft

    try:
        if any(s.split("=", 1)[0] == "help" for s in sets or []):
            _print_fields(SFTConfig)
            return
        from agentrl.warmstart.default_model import WARM_START, base_model_path, resolve_model_path

        base: dict = dict(WARM_START)
        if data:
            base["num_demos"] = 0
        if steps is not None:
            base["steps"] = steps
        cfg = build_sft_config(sets or [], base=base)
        model_path = base_model_path() if model is None else resolve_model_path(model)
        summary = run_sft(model_path, out, cfg, data=data or [], log=_progress(cfg.steps, not quiet and sys.stderr.isatty()))
    except AgentRLError as e:
        fail(e)
    tab = Table(title="sft")
    tab.add_column("")
    tab.add_column("value", justify="right")
    for k, v in summary.items():
        tab.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    console.print(tab)
    console.print(f"wrote {summary['model']}")


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]sft"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[status]}"), transient=False)
    task = bar.add_task("sft", total=total, status="")
    bar.start()

    def log(step: int, metrics: dict) -> None:
        bar.update(task, completed=step, status=f"loss={metrics['loss']:.3f}")
        if step >= total:
            bar.stop()

    return log


def _print_fields(cls) -> None:
    from agentrl.config.schema import field_docs

    tab = Table(title="sft fields (--set name=value)")
    for col in ("field", "default", "doc"):
        tab.add_column(col)
    for name, text, default in field_docs(cls):
        tab.add_row(name, repr(default), text)
    console.print(tab)
