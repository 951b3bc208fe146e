"""`agentrl export-sft`: stored episodes to chat JSONL for `agentrl sft --data` (registered by agentrl.cli.main).

Owns the command's arguments and its summary line (``kept N of M episodes; excluded: <reason>=<count>``,
infrastructure outcomes marked ``infra``); everything it runs is ``agentrl.jobs.export_sft``. It takes
no config (``-c``/``--set`` are refused with the reason): what it exports is what the source stored.
"""

from __future__ import annotations

import typer
from rich.console import Console

from agentrl.cli.errors import fail
from agentrl.cli.options import ConfigOpt, SetOpt, refuse
from agentrl.errors import AgentRLError

console = Console()


def export_sft_cmd(
    source: str = typer.Argument(
        ...,
        help="A run or rollout directory (trajectories.jsonl, trajectories/step_*.jsonl), or a file: "
        "trajectories (.jsonl/.parquet) or an eval's X.episodes.jsonl (its X.jsonl stands for it).",
    ),
    out: str = typer.Option(..., "--out", "-o", help="The chat JSONL to write (rows {messages, tools})."),
    min_reward: float | None = typer.Option(
        None, "--min-reward", "-r", help="Keep ok episodes with at least this reward (default: every ok episode)."
    ),
    dedupe: bool = typer.Option(False, "--dedupe", help="Write identical rows once."),
    config: list[str] | None = ConfigOpt,
    sets: list[str] | None = SetOpt,
) -> None:
    """Write the episodes that ended ok with reward >= --min-reward as chat rows for `agentrl sft --data`.

    Each row holds the tools the episode advertised, its messages (assistant turns with their tool
    calls, tool results as tool messages). Infrastructure failures and truncated episodes are left
    out and counted."""
    from agentrl.jobs.export_sft import export_sft  # lazy: keeps CLI start light

    try:
        refuse("export-sft", config, sets, "it writes what the source stored; its flags choose the episodes")
        counts = export_sft(source, out, min_reward=min_reward, dedupe=dedupe)
    except AgentRLError as e:
        fail(e)
    console.print(f"{counts.line()}; wrote {out}", highlight=False, markup=False, soft_wrap=True)
