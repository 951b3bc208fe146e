"""`agentrl eval`: run any registered env with an API model (registered on the main app by agentrl.cli.main).

Owns the command's arguments, the progress line and the summary table; everything it runs is
``agentrl.jobs.eval`` (episodes, files) and ``agentrl.common.llm_api`` (the model calls). API keys come
from the environment only (``OPENAI_API_KEY``... or the variable named by ``--api-key-env``).
"""
from __future__ import annotations

import asyncio
import sys
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from agentrl.cli.errors import fail
from agentrl.errors import AgentRLError, ConfigError

console = Console()


def _pairs(items: Optional[List[str]], what: str) -> dict:
    """``k=v`` items -> dict, values read as YAML (``3``, ``true``, ``[a, b]``, ``{x: 1}``)."""
    import yaml

    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} must look like key=value, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"{what} {item!r}: the value is not valid YAML ({e})") from None
    return out


def eval_cmd(
    env: str = typer.Option(..., "--env", "-e", help="Env id (see `agentrl envs`)."),
    model: str = typer.Option(..., "--model", "-m", help="litellm provider/name, e.g. openai/gpt-4o-mini."),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="Endpoint URL (an OpenAI-compatible server: http://host:port/v1)."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Read the API key from this environment variable (default: the provider's own, e.g. OPENAI_API_KEY)."),
    n: int = typer.Option(8, "--num-episodes", "-n", help="Episodes (one task each)."),
    out: str = typer.Option("runs/eval/episodes.jsonl", "--out", "-o", help="Chat JSONL for `agentrl sft --data`; X.episodes.jsonl and X.summary.json are written beside it."),
    env_args: Optional[List[str]] = typer.Option(None, "--env-arg", help="Env kwarg: --env-arg split=eval (repeatable, YAML values)."),
    sampling: Optional[List[str]] = typer.Option(None, "--sampling", help="Sampling param for every call: --sampling top_p=0.9 (repeatable, YAML values)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", "-t", help="Sampling temperature (default: the provider's)."),
    max_tokens: int = typer.Option(1024, "--max-tokens", help="Most tokens per assistant turn."),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", help="Assistant turns per episode (default: the env's hint, else 8)."),
    concurrency: int = typer.Option(8, "--concurrency", "-c", help="Episodes (and API calls) in flight at once."),
    timeout_s: float = typer.Option(120.0, "--timeout", help="Seconds one API call may take."),
    retries: int = typer.Option(3, "--retries", help="Retries of a failed API call (connection errors, 429, 5xx)."),
    episode_timeout_s: float = typer.Option(1800.0, "--episode-timeout", help="Seconds one episode may take (outcome 'deadline')."),
    seed: int = typer.Option(0, "--seed", help="Task selection seed (the same tasks as `agentrl rollout` with this seed)."),
    score_truncated: bool = typer.Option(False, "--score-truncated", help="Hand a turn cut at max-tokens to the env as the final answer."),
    min_reward: Optional[float] = typer.Option(None, "--min-reward", help="Write only ok episodes with at least this reward to the chat JSONL (default: every ok episode)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-episode lines."),
) -> None:
    """Run an env with an API model (text level): solve rate / reward summary, trajectories as chat JSONL."""
    from agentrl.jobs.eval import run_eval
    from agentrl.common.llm_api import ApiClient

    show = not quiet and sys.stderr.isatty()

    def progress(ep) -> None:
        if show:
            console.print(f"episode {ep.index}: {ep.outcome} reward={ep.reward:g} turns={ep.turns}", highlight=False)

    try:
        params = {"max_tokens": max_tokens, **_pairs(sampling, "--sampling")}
        if temperature is not None:
            params["temperature"] = temperature
        client = ApiClient(model, api_base=api_base, api_key_env=api_key_env, timeout_s=timeout_s,
                           max_retries=retries, concurrency=concurrency, sampling=params)
        summary = asyncio.run(run_eval(env, client, n=n, env_kwargs=_pairs(env_args, "--env-arg"), seed=seed,
                                       max_turns=max_turns, concurrency=concurrency,
                                       episode_timeout_s=episode_timeout_s, score_truncated=score_truncated,
                                       min_reward=min_reward, out=out, on_episode=progress))
    except AgentRLError as e:
        fail(e)
    tab = Table(title=f"agentrl eval: {env} / {model}")
    tab.add_column("metric")
    tab.add_column("value", justify="right")
    for key in ("episodes", "solve_rate", "infra_failure_rate", "infra_failures", "reward_mean", "tool_use_rate",
                "turns_mean", "prompt_tokens", "completion_tokens", "chat_rows", "wall_s"):
        v = summary[key]
        tab.add_row(key, f"{v:.3f}" if isinstance(v, float) else str(v))
    tab.add_row("outcomes", ", ".join(f"{k}={v}" for k, v in sorted(summary["outcomes"].items())))
    console.print(tab)
    files = summary["files"]
    console.print(f"wrote {files['chat']} ({summary['chat_rows']} chat rows), {files['episodes']}, {files['summary']}",
                  highlight=False)
