"""The `agentrl` command line: a thin typer shell over plain functions.

Owns argument parsing, ``--version`` and printing tables; errors become one clear red line and exit
code 2 through ``agentrl.cli.errors`` (``--debug`` shows the traceback). Every command takes the
shared ``-c/--config`` and ``--set`` options of ``agentrl.cli.options`` (``envs`` refuses them with a
reason). Everything it runs lives in importable modules (jobs, registry, template_check).
"""

from __future__ import annotations

import re
import sys

import typer
from rich.console import Console
from rich.table import Table

from agentrl import __version__
from agentrl.cli.errors import ErrorGroup, fail, set_debug
from agentrl.cli.options import ConfigOpt, SetOpt, load, named, pick, refuse
from agentrl.errors import AgentRLError, ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    cls=ErrorGroup,
    help="Reinforcement learning for multi-turn tool-calling LLM agents.",
)
console = Console()


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"agentrl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback of an error."),
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    set_debug(debug)


_fail = fail


def _load(config: list[str] | None, sets: list[str] | None, base: dict, given: dict | None = None):
    from agentrl.config.schema import load_config  # lazy: keeps CLI start light

    return load_config(config or [], sets or [], base=base, given=given)


@app.command()
def envs(config: list[str] | None = ConfigOpt, sets: list[str] | None = SetOpt) -> None:
    """List registered environments (built-in and from the `agentrl.envs` entry-point group)."""
    from agentrl.envs.registry import registered  # lazy: pulls in gymnasium

    try:
        refuse(
            "envs",
            config,
            sets,
            "it lists every registered env; `agentrl config -c FILE` shows the env a config names (env.id, env.kwargs)",
        )
    except AgentRLError as e:
        _fail(e)

    tab = Table(title="registered environments")
    for col in ("id", "entry point", "defaults", "run recipe"):
        tab.add_column(col)
    for env_id, spec in sorted(registered().items()):
        ep = (
            spec.entry_point
            if isinstance(spec.entry_point, str)
            else getattr(spec.entry_point, "__qualname__", str(spec.entry_point))
        )
        recipe = ", ".join(spec.run_defaults) or "-"  # the config sections it sets (agentrl.envs.recipes)
        tab.add_row(env_id, ep, ", ".join(f"{k}={v!r}" for k, v in spec.kwargs.items()) or "-", recipe)
    console.print(tab)
    console.print("an env's run recipe lies under your config when env.id names it: agentrl config --set env.id=ID")


def _rollout_base() -> dict:
    """The layer of `agentrl rollout`'s defaults, under -c."""
    return {"env": {"id": "code_exec"}}


def _rollout_given(
    env: str | None = None,
    model: str | None = None,
    num_prompts: int | None = None,
    group_size: int | None = None,
    out: str | None = None,
    agent: str | None = None,
) -> dict:
    """The layer of the options given to `agentrl rollout`: over -c, under --set."""
    given = _given(env=env, agent=agent, model=model, out=out)
    ro = {k: v for k, v in (("num_prompts", num_prompts), ("group_size", group_size)) if v is not None}
    if ro:
        given["rollout"] = ro
    return given


def _run_base(env: str | None = None, algo: str | None = None) -> dict:
    """The layer of `agentrl run`'s defaults, under -c: code_exec, grpo, and the run directory
    runs/ENV-ALGO named after the env and algorithm given on the command line."""
    env, algo = env or "code_exec", algo or "grpo"
    return {"env": {"id": "code_exec"}, "algo": {"name": "grpo"}, "output_dir": f"runs/{env}-{algo}"}


def _run_given(
    env: str | None = None,
    algo: str | None = None,
    model: str | None = None,
    steps: int | None = None,
    out: str | None = None,
    resume: bool = False,
    agent: str | None = None,
) -> dict:
    """The layer of the options given to `agentrl run`: over -c, under --set."""
    given = _given(env=env, agent=agent, model=model, out=out)
    if algo:
        given["algo"] = {"name": algo}
    train = {k: v for k, v in (("steps", steps), ("resume", resume or None)) if v is not None}
    if train:
        given["train"] = train
    return given


def _given(*, env: str | None, agent: str | None, model: str | None, out: str | None) -> dict:
    """The layer of the options `run` and `rollout` share, for those given."""
    given: dict = {}
    if env:
        given["env"] = {"id": env}
    if agent:
        given["agent"] = {"kind": agent}
    if model:
        given["model"] = {"path": model}
    if out:
        given["output_dir"] = out
    return given


#: the layer of each job's command run with no options of its own (what `agentrl config --job` resolves)
JOB_BASES = {"run": _run_base, "rollout": _rollout_base}


@app.command()
def rollout(
    env: str | None = typer.Option(None, "--env", "-e", help="Env id (see `agentrl envs`); default code_exec."),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Local HF model dir, GGUF file or Hub id (org/name, org/name@revision); default: the built-in tiny model.",
    ),
    num_prompts: int | None = typer.Option(None, "--num-prompts", "-n", help="Tasks to sample (rollout.num_prompts)."),
    group_size: int | None = typer.Option(None, "--group-size", "-g", help="Samples per task (rollout.group_size)."),
    out: str | None = typer.Option(None, "--out", "-o", help="Output directory (output_dir)."),
    agent: str | None = typer.Option(
        None,
        "--agent",
        help="builtin | proxy (agent.kind): proxy runs agent.command / agent.callable per episode against a "
        "recording endpoint (OpenAI chat, Anthropic Messages, OpenAI Responses).",
    ),
    config: list[str] | None = ConfigOpt,
    sets: list[str] | None = SetOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Collect trajectories from a model on an env; writes trajectories.jsonl, metrics.json, config.yaml."""
    from agentrl.jobs.rollout import run_rollout  # lazy: keeps CLI start light

    given = _rollout_given(env, model, num_prompts, group_size, out, agent)
    try:
        cfg = _load(config, sets, _rollout_base(), given)
        trajs, metrics, out_dir = run_rollout(
            cfg, progress=not quiet and sys.stderr.isatty(), note=lambda line: console.print(line, soft_wrap=True)
        )
    except AgentRLError as e:
        _fail(e)
    console.print(metrics.table(f"rollout: {cfg.env.id}"))
    console.print(f"wrote {len(trajs)} trajectories to {out_dir / 'trajectories.jsonl'}")


@app.command()
def run(
    env: str | None = typer.Option(None, "--env", "-e", help="Env id (see `agentrl envs`); default code_exec."),
    algo: str | None = typer.Option(
        None,
        "--algo",
        "-a",
        help="grpo (default) | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline | ppo | dapo | gspo | cispo "
        "| opd (algo.name; opd distills from algo.teacher).",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Local HF model dir, GGUF file or Hub id (org/name, org/name@revision); default: the built-in "
        "SFT-warm-started tiny model.",
    ),
    steps: int | None = typer.Option(None, "--steps", help="Optimizer steps (train.steps)."),
    out: str | None = typer.Option(None, "--out", "-o", help="Run directory (output_dir); default runs/ENV-ALGO."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in the run directory."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="The run directory holds a run: move it to DIR.old-N and start afresh."
    ),
    agent: str | None = typer.Option(
        None,
        "--agent",
        help="builtin | proxy (agent.kind): proxy runs agent.command / agent.callable per episode against a "
        "recording endpoint (OpenAI chat, Anthropic Messages, OpenAI Responses).",
    ),
    config: list[str] | None = ConfigOpt,
    sets: list[str] | None = SetOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
) -> None:
    """The main job: rollouts -> rewards -> credit -> update -> weight sync, with evaluation and checkpoints."""
    import asyncio

    from agentrl.jobs.run import Runner  # lazy: pulls in torch

    given = _run_given(env, algo, model, steps, out, resume, agent)
    try:
        cfg = _load(config, sets, _run_base(env, algo), given)
        _claim_run_dir(cfg, overwrite)
        summary = asyncio.run(_run_stoppable(Runner(cfg, progress=not quiet)))
    except AgentRLError as e:
        _fail(e)
    tab = Table(title=f"agentrl run: {cfg.env.id} / {cfg.algo.name}")
    tab.add_column("metric")
    tab.add_column("value", justify="right")
    rollout = summary.get("rollout") or {}
    rows = [
        (k, summary.get(k))
        for k in (
            "steps",
            "wall_s",
            "eval_solve_rate_start",
            "eval_episodes_start",
            "eval_infra_failures_start",
            "eval_infra_failure_rate_start",
            "eval_solve_rate_end",
            "eval_episodes_end",
            "eval_infra_failures_end",
            "eval_infra_failure_rate_end",
            "eval_tool_use_rate_end",
        )
    ]
    rows += [
        (f"rollout_{k}", rollout.get(k))
        for k in ("solve_rate", "infra_failure_rate", "infra_failures", "episodes", "batched_episodes")
    ]
    rows += [(f"agent_{k}", v) for k, v in (summary.get("agent") or {}).items()]  # proxy mode's counters
    for key, v in rows:  # solve rates count every task; an infrastructure failure is an unsolved one
        tab.add_row(key, _cell(key, v))
    console.print(tab)
    console.print(f"run directory: {cfg.output_dir} (metrics.jsonl, curves.png, summary.json, checkpoints/)")
    if summary.get("stopped"):
        console.print(
            f"stopped by {summary['stopped']['reason']} at step {summary['stopped']['step']} "
            f"(checkpointed); continue with --resume"
        )
        raise typer.Exit(128 + 15)


def _cell(key: str, v) -> str:
    """A summary value as the table shows it: counts as integers, other numbers to 3 decimals."""
    if isinstance(v, float):
        return str(int(v)) if re.search(r"(episodes|infra_failures)(_start|_end)?$", key) else f"{v:.3f}"
    return str(v)


def _claim_run_dir(cfg, overwrite: bool) -> None:
    """A run directory holding a run is used only with --resume or --overwrite (agentrl.jobs.run_dir)."""
    from agentrl.jobs.run_dir import prepare_run_dir  # lazy: keeps CLI start light

    moved = prepare_run_dir(cfg.output_dir, resume=cfg.train.resume, overwrite=overwrite)
    if moved is not None:
        console.print(f"--overwrite: moved the previous run in {cfg.output_dir} to {moved}", highlight=False)


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
def check_template_cmd(
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Local HF model or tokenizer dir, GGUF file, or Hub id (default: model.path of the config).",
    ),
    config: list[str] | None = ConfigOpt,
    sets: list[str] | None = SetOpt,
) -> None:
    """Report whether a chat template keeps the prefix property token-exact multi-turn needs, rendered as a
    run would (model.chat_template, model.tool_prompt), and which way tools reach the model."""
    from pathlib import Path

    from agentrl.episodes.template_check import check_template, render_report  # lazy: keeps CLI start light
    from agentrl.episodes.tokenizer import load_chat_tokenizer  # lazy: keeps CLI start light
    from agentrl.models.gguf import converted_dir, find_gguf  # lazy: keeps CLI start light

    try:
        cfg = load(config, sets)
        model = pick(model, cfg, "model.path", named(config, sets))
        if model is None:
            raise AgentRLError("check-template needs a model: --model DIR, or a config naming model.path")
        gguf = find_gguf(model, "--model") if Path(model).expanduser().exists() else None
        target = converted_dir(gguf, "--model") if gguf is not None else model  # a GGUF: its converted dir
        tok, chat = load_chat_tokenizer(target, cfg.model.chat_template, cfg.model.tool_prompt, model=model)
    except AgentRLError as e:
        _fail(e)
    except (OSError, ValueError) as e:
        _fail(AgentRLError(f"cannot load a tokenizer from {model!r}: {e}"))
    report = check_template(tok, tools=[] if chat.tools.used == "none" else None)
    console.print(chat.line(), highlight=False)
    console.print(render_report(report))
    raise typer.Exit(0 if report.ok else 1)


@app.command("config")
def config_cmd(
    config: list[str] | None = ConfigOpt,
    sets: list[str] | None = SetOpt,
    docs: bool = typer.Option(False, "--docs", help="List every field with its default and doc."),
    job: str = typer.Option(
        "run", "--job", help="Resolve for `agentrl run` or `agentrl rollout` (with that command's defaults)."
    ),
) -> None:
    """Print the resolved config: exactly what `agentrl JOB -c ... --set ...` runs (or every field's documentation)."""
    import yaml

    from agentrl.config.plan import JOBS, resolve  # lazy: keeps CLI start light
    from agentrl.config.schema import field_docs, to_dict  # lazy: keeps CLI start light

    if docs:
        tab = Table(title="config fields")
        for col in ("field", "default", "doc"):
            tab.add_column(col)
        for name, text, default in field_docs():
            tab.add_row(name, repr(default), text)
        console.print(tab)
        return
    try:
        if job not in JOBS:
            raise ConfigError(f"--job: {job!r} is not one of {list(JOBS)}")
        cfg = resolve(_load(config, sets, JOB_BASES[job]()), job).cfg
    except AgentRLError as e:
        _fail(e)
    typer.echo(yaml.safe_dump(to_dict(cfg), sort_keys=False), nl=False)  # plain: valid YAML at any width


from agentrl.cli.sandbox import app as sandbox_app  # noqa: E402

app.add_typer(sandbox_app, name="sandbox")
from agentrl.cli.sft import sft_cmd  # noqa: E402

app.command("sft")(sft_cmd)
from agentrl.cli.eval import eval_cmd  # noqa: E402

app.command("eval")(eval_cmd)
from agentrl.cli.export_sft import export_sft_cmd  # noqa: E402

app.command("export-sft")(export_sft_cmd)
from agentrl.cli.serve import serve_cmd  # noqa: E402

app.command("serve")(serve_cmd)
from agentrl.cli.report import report_cmd  # noqa: E402

app.command("report")(report_cmd)
from agentrl.cli.doctor import doctor_cmd  # noqa: E402

app.command("doctor")(doctor_cmd)
from agentrl.cli.setup import app as setup_app  # noqa: E402

app.add_typer(setup_app, name="setup")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
