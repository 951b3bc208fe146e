"""`agentrl sft`: the supervised warm start as a command (registered on the main app by agentrl.cli.main).

Owns the command's arguments and its summary table; everything it runs is ``agentrl.warmstart.sft``.

``-c/--set`` are the one config tree: the stage reads its ``sft.*`` section, ``model.path`` (the
model to fine-tune when ``--model`` is not given), ``model.chat_template`` and ``model.tool_prompt``
(how its chats are rendered, as in a run). Layers: the built-in warm-start recipe (and
``--steps``, ``--data``'s ``sft.num_demos=0``) <- the ``-c`` files <- ``--set``. The flat names of
0.1.0 (``--set lr=1e-3``) still work for one release, as ``sft.lr``, with a deprecation note.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from agentrl.cli.errors import fail
from agentrl.cli.options import ConfigOpt, SetOpt
from agentrl.errors import AgentRLError

console = Console()


def sft_cmd(
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Local HF model dir, GGUF file or Hub id (org/name, org/name@revision) to fine-tune; "
        "default: the built-in tiny model before its warm start.",
    ),
    data: list[str] | None = typer.Option(
        None, "--data", "-d", help='Chat JSONL file(s): rows {"messages": [...], "tools": [...]} (repeatable).'
    ),
    out: str = typer.Option("runs/sft", "--out", "-o", help="Where the fine-tuned HF model directory is written."),
    steps: int | None = typer.Option(None, "--steps", "-n", help="Optimizer steps (sft.steps)."),
    config: list[str] | None = ConfigOpt,
    sets: list[str] | None = SetOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Fine-tune on oracle tool-use demonstrations of code_exec and/or your chat JSONL.

    With --data, demonstrations are off unless you --set sft.num_demos=N; without it, the default
    warm-start recipe of the built-in model is used. `--set help=1` lists the sft.* fields."""
    import dataclasses

    from agentrl.cli.options import load, named, pick
    from agentrl.warmstart.sft import SFTConfig, build_sft_config, run_sft

    try:
        if any(s.split("=", 1)[0].strip() in ("help", "sft.help") for s in sets or []):
            _print_fields(SFTConfig)
            return
        from agentrl.warmstart.default_model import WARM_START, base_model_path, resolve_model_path

        sets = dotted_sets(sets or [], note=_deprecated)
        base: dict = dict(WARM_START)
        if data:
            base["num_demos"] = 0
        if steps is not None:
            base["steps"] = steps
        tree = load(config, sets, {"sft": base})
        cfg = build_sft_config(base=dataclasses.asdict(tree.sft))  # the checks beyond one field (difficulties)
        model = pick(model, tree, "model.path", named(config, sets))
        model_path = base_model_path() if model is None else resolve_model_path(model)
        summary = run_sft(
            model_path,
            out,
            cfg,
            data=data or [],
            log=_progress(cfg.steps, not quiet and sys.stderr.isatty()),
            chat_template=tree.model.chat_template,
            tool_prompt=tree.model.tool_prompt,
        )
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

    bar = Progress(
        TextColumn("[bold]sft"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        transient=False,
    )
    task = bar.add_task("sft", total=total, status="")
    bar.start()

    def log(step: int, metrics: dict) -> None:
        bar.update(task, completed=step, status=f"loss={metrics['loss']:.3f}")
        if step >= total:
            bar.stop()

    return log


def _deprecated(msg: str) -> None:
    Console(stderr=True, soft_wrap=True).print(f"[yellow]deprecated:[/] {msg}", highlight=False)


def dotted_sets(sets: list[str], note) -> list[str]:
    """``--set`` items with 0.1.0's flat SFT names (``lr=1e-3``) rewritten to their dotted field
    (``sft.lr=1e-3``), calling ``note`` once per rewrite; every other item is unchanged."""
    from dataclasses import fields

    from agentrl.config.schema import RunConfig
    from agentrl.warmstart.config import SFTConfig

    flat = {f.name for f in fields(SFTConfig)} - {f.name for f in fields(RunConfig)}
    out = []
    for item in sets:
        key, sep, value = item.partition("=")
        if sep and key.strip() in flat:
            note(f"--set {key.strip()}=... is now --set sft.{key.strip()}=... (flat names go in the next release)")
            item = f"sft.{key.strip()}={value}"
        out.append(item)
    return out


def _print_fields(cls) -> None:
    from agentrl.config.schema import field_docs

    tab = Table(title="sft fields (--set sft.name=value)")
    for col in ("field", "default", "doc"):
        tab.add_column(col)
    for name, text, default in field_docs(cls, "sft."):
        tab.add_row(name, repr(default), text)
    console.print(tab)
