"""The `agentrl` command line: a thin typer shell over plain functions.

Owns argument parsing and printing tables; errors become one clear red line and exit code 2
through ``agentrl.cli.errors`` (``--debug`` shows the traceback). Everything it runs lives in importable modules (rollout, registry, template_check).
"""
from __future__ import annotations

import sys
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from agentrl.cli.errors import ErrorGroup, fail, set_debug
from agentrl.errors import AgentRLError

app = typer.Typer(add_completion=False, no_args_is_help=True, cls=ErrorGroup,
                  help="Reinforcement learning for multi-turn tool-calling LLM agents.")
console = Console()

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config file(s), merged in order (see configs/).")
SetOpt = typer.Option(None, "--set", "-s", help="Override a config field: --set rollout.group_size=8 (repeatable).")


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="Show the full traceback of an error.")) -> None:
    set_debug(debug)


_fail = fail


def _load(config: Optional[List[str]], sets: Optional[List[str]], base: dict):
    from agentrl.config.schema import load_config

    return load_config(config or [], sets or [], base=base)


@app.command()
def envs() -> None:
    """List registered environments (built-in and from the `agentrl.envs` entry-point group)."""
    from agentrl.envs.registry import registered

    tab = Table(title="registered environments")
    for col in ("id", "entry point", "defaults"):
        tab.add_column(col)
    for env_id, spec in sorted(registered().items()):
        ep = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__qualname__", str(spec.entry_point))
        tab.add_row(env_id, ep, ", ".join(f"{k}={v!r}" for k, v in spec.kwargs.items()) or "-")
    console.print(tab)


@app.command()
def rollout(
    env: str = typer.Option("code_exec", "--env", "-e", help="Env id (see `agentrl envs`)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Local HF model dir; default: the built-in tiny model."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", "-n", help="Tasks to sample (rollout.num_prompts)."),
    group_size: Optional[int] = typer.Option(None, "--group-size", "-g", help="Samples per task (rollout.group_size)."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output directory (output_dir)."),
    config: Optional[List[str]] = ConfigOpt,
    sets: Optional[List[str]] = SetOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Collect trajectories from a model on an env; writes trajectories.jsonl, metrics.json, config.yaml."""
    from agentrl.jobs.rollout import run_rollout

    base: dict = {"env": {"id": env}}
    if model:
        base["model"] = {"path": model}
    if out:
        base["output_dir"] = out
    ro = {k: v for k, v in (("num_prompts", num_prompts), ("group_size", group_size)) if v is not None}
    if ro:
        base["rollout"] = ro
    try:
        cfg = _load(config, sets, base)
        trajs, metrics, out_dir = run_rollout(cfg, progress=not quiet and sys.stderr.isatty(),
                                              note=lambda line: console.print(line, soft_wrap=True))
    except AgentRLError as e:
        _fail(e)
    console.print(metrics.table(f"rollout: {cfg.env.id}"))
    console.print(f"wrote {len(trajs)} trajectories to {out_dir / 'trajectories.jsonl'}")


@app.command()
def run(
    env: str = typer.Option("code_exec", "--env", "-e", help="Env id (see `agentrl envs`)."),
    algo: str = typer.Option("grpo", "--algo", "-a", help="grpo | dr_grpo | rloo | reinforce_pp | ppo (algo.name)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Local HF model dir; default: the built-in SFT-warm-started tiny model."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps (train.steps)."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Run directory (output_dir); default runs/ENV-ALGO."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in the run directory."),
    config: Optional[List[str]] = ConfigOpt,
    sets: Optional[List[str]] = SetOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
) -> None:
    """The main job: rollouts -> rewards -> credit -> update -> weight sync, with evaluation and checkpoints."""
    import asyncio

    from agentrl.jobs.run import Runner

    base: dict = {"env": {"id": env}, "algo": {"name": algo}, "output_dir": out or f"runs/{env}-{algo}"}
    if model:
        base["model"] = {"path": model}
    train = {k: v for k, v in (("steps", steps), ("resume", resume or None)) if v is not None}
    if train:
        base["train"] = train
    try:
        cfg = _load(config, sets, base)
        summary = asyncio.run(_run_stoppable(Runner(cfg, progress=not quiet)))
    except AgentRLError as e:
        _fail(e)
    tab = Table(title=f"agentrl run: {cfg.env.id} / {cfg.algo.name}")
    tab.add_column("metric")
    tab.add_column("value", justify="right")
    rollout = summary.get("rollout") or {}
    rows = [(k, summary.get(k)) for k in ("steps", "wall_s", "eval_solve_rate_start", "eval_infra_failure_rate_start",
                                          "eval_solve_rate_end", "eval_infra_failure_rate_end", "eval_tool_use_rate_end")]
    rows += [(f"rollout_{k}", rollout.get(k)) for k in ("solve_rate", "infra_failure_rate", "infra_failures", "episodes")]
    for key, v in rows:  # solve rates count every task; an infrastructure failure is an unsolved one
        tab.add_row(key, f"{v:.3f}" if isinstance(v, float) else str(v))
    console.print(tab)
    console.print(f"run directory: {cfg.output_dir} (metrics.jsonl, curves.png, summary.json, checkpoints/)")
    if summary.get("stopped"):
        console.print(f"stopped by {summary['stopped']['reason']} at step {summary['stopped']['step']} "
                      f"(checkpointed); continue with --resume")
        raise typer.Exit(128 + 15)


async def _run_stoppable(runner) -> dict:
    """SIGTERM (a scheduler's preemption, `kill`) stops the run gracefully: checkpoint, clean up
    launched servers and actors, exit 143; a second SIGTERM stops at once (cleanup still runs)."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, runner.request_stop, "SIGTERM")
    try:
        return await runner.run()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


@app.command("check-template")
def check_template_cmd(model: str = typer.Option(..., "--model", "-m", help="Local HF model or tokenizer dir.")) -> None:
    """Report whether a chat template keeps the prefix property token-exact multi-turn needs."""
    from transformers import AutoTokenizer

    from agentrl.episodes.template_check import check_template, render_report

    try:
        tok = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as e:
        _fail(AgentRLError(f"cannot load a tokenizer from {model!r}: {e}"))
    report = check_template(tok)
    console.print(render_report(report))
    raise typer.Exit(0 if report.ok else 1)


@app.command("config")
def config_cmd(
    config: Optional[List[str]] = ConfigOpt,
    sets: Optional[List[str]] = SetOpt,
    docs: bool = typer.Option(False, "--docs", help="List every field with its default and doc."),
) -> None:
    """Print the resolved config (or every field's documentation)."""
    import yaml

    from agentrl.config.schema import field_docs, to_dict

    if docs:
        tab = Table(title="config fields")
        for col in ("field", "default", "doc"):
            tab.add_column(col)
        for name, text, default in field_docs():
            tab.add_row(name, repr(default), text)
        console.print(tab)
        return
    try:
        cfg = _load(config, sets, {})
    except AgentRLError as e:
        _fail(e)
    console.print(yaml.safe_dump(to_dict(cfg), sort_keys=False))


from agentrl.cli.sandbox import app as sandbox_app  # noqa: E402

app.add_typer(sandbox_app, name="sandbox")
from agentrl.cli.sft import sft_cmd  # noqa: E402

app.command("sft")(sft_cmd)
from agentrl.cli.eval import eval_cmd  # noqa: E402

app.command("eval")(eval_cmd)
from agentrl.cli.serve import serve_cmd  # noqa: E402

app.command("serve")(serve_cmd)
from agentrl.cli.report import report_cmd  # noqa: E402

app.command("report")(report_cmd)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
