"""`agentrl sft`: the supervised warm start as a command (registered on the main app by agentrl.cli.main).

Owns the command's arguments and its summary table; everything it runs is ``agentrl.warmstart.sft``.

``-c/--set`` are the one config tree: the stage reads its ``sft.*`` section, ``model.path`` (the
model to fine-tune when ``--model`` is not given), ``model.chat_template`` and ``model.tool_prompt``
(how its chats are rendered, as in a run). Layers: the field defaults (``--steps``, ``--data``'s
``sft.num_demos=0``) <- the ``-c`` files <- ``--set``; then the fields still null take a recipe,
said in one line at start: the built-in model's warm start (``WARM_START``) when no model is named,
the pretrained recipe (``agentrl.warmstart.config.PRETRAINED``) otherwise. Off a terminal, progress
is a line every ``sft.log_every`` steps (``agentrl.warmstart.progress``). The flat names of 0.1.0
(``--set lr=1e-3``) still work for one release, as ``sft.lr``, with a deprecation note.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from agentrl.cli.errors import fail
from agentrl.cli.options import ConfigOpt, SetOpt, load, named, pick
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

    With --data, demonstrations are off unless you --set sft.num_demos=N. Fields you leave unset take
    the built-in model's warm-start recipe without --model, and a recipe for a pretrained model with
    one (lr 5e-5; printed at start). `--set help=1` lists the sft.* fields."""
    import dataclasses

    from agentrl.warmstart.config import resolve  # lazy: keeps CLI start light
    from agentrl.warmstart.sft import SFTConfig, build_sft_config, run_sft  # lazy: keeps CLI start light

    try:
        if any(s.split("=", 1)[0].strip() in ("help", "sft.help") for s in sets or []):
            _print_fields(SFTConfig)
            return
        from agentrl.warmstart.default_model import base_model_path, resolve_model_path  # lazy: keeps CLI start light

        sets = dotted_sets(sets or [], note=_deprecated)
        base: dict = {}
        if data:
            base["num_demos"] = 0
        if steps is not None:
            base["steps"] = steps
        tree = load(config, sets, {"sft": base})
        model = pick(model, tree, "model.path", named(config, sets))
        sft = dataclasses.asdict(tree.sft)
        if model is None:  # the built-in tiny model from random weights: its own warm-start recipe
            sft = builtin_recipe(sft, _note)
        cfg, chosen = resolve(build_sft_config(base=sft))  # build: the checks beyond one field (difficulties)
        if chosen:
            _note(f"sft: {chosen}")
        model_path = base_model_path() if model is None else resolve_model_path(model)
        summary = run_sft(
            model_path,
            out,
            cfg,
            data=data or [],
            log=_progress(cfg, quiet),
            chat_template=tree.model.chat_template,
            tool_prompt=tree.model.tool_prompt,
            say=_note,
        )
    except AgentRLError as e:
        fail(e)
    tab = Table(title="sft")
    tab.add_column("")
    tab.add_column("value", justify="right")
    for k, v in summary.items():
        tab.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    console.print(tab)
    console.print(f"wrote {summary['model']}")


def builtin_recipe(sft: dict, note) -> dict:
    """The ``sft`` fields with those left null set from the built-in model's warm start
    (``agentrl.warmstart.default_model.WARM_START`` and its batching); ``note`` says which."""
    from agentrl.warmstart.default_model import WARM_START, WARM_START_BATCHING  # lazy: keeps CLI start light

    filled = {k: v for k, v in {**WARM_START, **WARM_START_BATCHING}.items() if sft.get(k) is None}
    if filled:
        text = ", ".join(f"sft.{k}={v:g}" for k, v in filled.items() if isinstance(v, (int, float)))
        note(f"sft: {text} (the built-in model's warm-start recipe; --set sft.NAME=VALUE to change)")
    return {**sft, **filled}


def _note(line: str) -> None:
    console.print(line, soft_wrap=True, highlight=False, markup=False)


def _progress(cfg, quiet: bool):
    """A progress bar on a terminal; else a line every ``sft.log_every`` steps and once a minute."""
    if quiet:
        return None
    if not sys.stderr.isatty():
        from agentrl.warmstart.progress import sft_progress  # lazy: keeps CLI start light

        every = cfg.log_every or max(1, cfg.steps // 20)
        return sft_progress("sft", cfg.steps, every, min_interval_s=60.0)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = cfg.steps
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
        status = f"loss={metrics['loss']:.3f} {metrics.get('tokens_per_s', 0):.0f} tok/s"
        bar.update(task, completed=step, status=status)
        if step >= total:
            bar.stop()

    return log


def _deprecated(msg: str) -> None:
    Console(stderr=True, soft_wrap=True).print(f"[yellow]deprecated:[/] {msg}", highlight=False)


def dotted_sets(sets: list[str], note) -> list[str]:
    """``--set`` items with 0.1.0's flat SFT names (``lr=1e-3``) rewritten to their dotted field
    (``sft.lr=1e-3``), calling ``note`` once per rewrite; every other item is unchanged."""
    from dataclasses import fields

    from agentrl.config.schema import RunConfig  # lazy: keeps CLI start light
    from agentrl.warmstart.config import SFTConfig  # lazy: keeps CLI start light

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
    from agentrl.config.schema import field_docs  # lazy: keeps CLI start light

    tab = Table(title="sft fields (--set sft.name=value)")
    for col in ("field", "default", "doc"):
        tab.add_column(col)
    for name, text, default in field_docs(cls, "sft."):
        tab.add_row(name, repr(default), text)
    console.print(tab)
