"""`agentrl eval`: run any registered env with an API model (registered on the main app by agentrl.cli.main).

Owns the command's arguments, the progress line and the summary table; everything it runs is
``agentrl.jobs.eval`` (episodes, files) and ``agentrl.common.llm_api`` (the model calls). API keys come
from the environment only (``OPENAI_API_KEY``... or the variable named by ``--api-key-env``); an
``--api-base`` on this machine (``agentrl serve``) needs none, and a hosted model without its key
stops here with one error, before any episode.

``-c/--set`` give the fields of the run config an API episode shares with a rollout
(:data:`FIELDS`: ``env.id``, ``env.kwargs`` and the ``rollout.*`` turns, tokens, sampling, deadline,
seed and concurrency). Each setting is its flag when given, else the config field when a file or
``--set`` names it, else this command's own default (1024 tokens a turn, 8 in flight, the env's
``max_turns`` hint, the provider's temperature). ``--env-arg`` items merge over ``env.kwargs``.
``--attempts`` (``eval.attempts``, default 1) runs each task that many times and adds pass@1..N and
avg@N to the table.

Every finished episode is on disk at once (``X.episodes.jsonl``), so an eval stopped by Ctrl-C,
SIGTERM or a crash loses only the episodes in flight. ``--resume`` is explicit (an eval rerun to
measure again must not silently reuse old answers): it continues the eval ``--out`` holds, running
only its missing and infrastructure-failed attempts, and refuses with one error naming each setting
that differs from the one it continues (``agentrl.jobs.eval_store``).

An eval in which every episode failed for an infrastructure reason (the endpoint down, a broken env)
is not a result: after writing its files it ends with one error line naming the outcome and the first
episode's detail, and exits 2 like every ``AgentRLError`` (``agentrl.cli.errors``).
"""

from __future__ import annotations

import asyncio
import sys

import typer
from rich.console import Console
from rich.table import Table

from agentrl.cli.errors import fail
from agentrl.cli.options import ConfigOpt, SetOpt, load, named, pick
from agentrl.errors import AgentRLError, ConfigError

console = Console()
#: setting -> (the run-config field it reads, this command's default when neither flag nor config names it)
FIELDS = {
    "env": ("env.id", None),
    "max_turns": ("rollout.max_turns", None),
    "max_tokens": ("rollout.max_new_tokens", 1024),
    "temperature": ("rollout.temperature", None),
    "top_p": ("rollout.top_p", None),
    "concurrency": ("rollout.max_concurrency", 8),
    "episode_timeout_s": ("rollout.episode_timeout_s", 1800.0),
    "seed": ("rollout.seed", 0),
    "score_truncated": ("rollout.score_truncated", False),
    "attempts": ("eval.attempts", 1),
}


def _pairs(items: list[str] | None, what: str) -> dict:
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
    env: str | None = typer.Option(None, "--env", "-e", help="Env id (see `agentrl envs`; env.id, default code_exec)."),
    model: str = typer.Option(..., "--model", "-m", help="litellm provider/name, e.g. openai/gpt-4o-mini."),
    api_base: str | None = typer.Option(
        None, "--api-base", help="Endpoint URL (an OpenAI-compatible server: http://host:port/v1)."
    ),
    api_key_env: str | None = typer.Option(
        None,
        "--api-key-env",
        help="Read the API key from this environment variable (default: the provider's own, e.g. OPENAI_API_KEY; "
        "an --api-base on this machine needs none).",
    ),
    n: int = typer.Option(8, "--num-episodes", "-n", help="Tasks (one episode each, or --attempts each)."),
    attempts: int | None = typer.Option(
        None,
        "--attempts",
        help="Attempts per task (eval.attempts; default 1): above 1 the table adds pass@1..N (unbiased "
        "estimator) and avg@N, an infrastructure failure counting as an unsolved attempt.",
    ),
    out: str = typer.Option(
        "runs/eval/episodes.jsonl",
        "--out",
        "-o",
        help="Chat JSONL for `agentrl sft --data`; X.episodes.jsonl and X.summary.json are written beside it.",
    ),
    env_args: list[str] | None = typer.Option(
        None, "--env-arg", help="Env kwarg: --env-arg split=eval (repeatable, YAML values; merged over env.kwargs)."
    ),
    sampling: list[str] | None = typer.Option(
        None, "--sampling", help="Sampling param for every call: --sampling top_p=0.9 (repeatable, YAML values)."
    ),
    temperature: float | None = typer.Option(
        None, "--temperature", "-t", help="Sampling temperature (rollout.temperature; default: the provider's)."
    ),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", help="Most tokens per assistant turn (rollout.max_new_tokens; default 1024)."
    ),
    max_turns: int | None = typer.Option(
        None, "--max-turns", help="Assistant turns per episode (rollout.max_turns; default: the env's hint, else 8)."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="Episodes (and API calls) in flight at once (rollout.max_concurrency; default 8)."
    ),
    timeout_s: float = typer.Option(120.0, "--timeout", help="Seconds one API call may take."),
    retries: int = typer.Option(
        3,
        "--retries",
        help="Retries of a transient API failure (timeouts, connection errors, 429, 5xx; never 401/400).",
    ),
    episode_timeout_s: float | None = typer.Option(
        None,
        "--episode-timeout",
        help="Seconds one episode may take, outcome 'deadline' (rollout.episode_timeout_s; default 1800).",
    ),
    seed: int | None = typer.Option(
        None,
        "--seed",
        help="Task selection seed: the same tasks as `agentrl rollout` with this seed (rollout.seed; default 0).",
    ),
    score_truncated: bool | None = typer.Option(
        None,
        "--score-truncated/--no-score-truncated",
        help="Hand a turn cut at max-tokens to the env as the final answer (rollout.score_truncated; default off).",
    ),
    min_reward: float | None = typer.Option(
        None,
        "--min-reward",
        help="Write only ok episodes with at least this reward to the chat JSONL (default: every ok episode).",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the eval --out holds (interrupted, or to add tasks/attempts): run only the attempts "
        "it lacks or that failed for an infrastructure reason. Its settings must match (-n and --attempts "
        "may grow). Without it an existing --out is overwritten.",
    ),
    config: list[str] | None = ConfigOpt,
    sets: list[str] | None = SetOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-episode lines."),
) -> None:
    """Run an env with an API model (text level): solve rate / reward summary, trajectories as chat JSONL."""
    from agentrl.common.llm_api import ApiClient  # lazy: keeps CLI start light
    from agentrl.jobs.eval import run_eval  # lazy: keeps CLI start light

    show = not quiet and sys.stderr.isatty()

    def progress(ep) -> None:
        if show:
            which = f"episode {ep.index}" + (f" attempt {ep.attempt}" if s["attempts"] > 1 else "")
            console.print(f"{which}: {ep.outcome} reward={ep.reward:g} turns={ep.turns}", highlight=False)

    try:
        s = settings(
            config,
            sets,
            env=env,
            max_turns=max_turns,
            max_tokens=max_tokens,
            temperature=temperature,
            concurrency=concurrency,
            episode_timeout_s=episode_timeout_s,
            seed=seed,
            score_truncated=score_truncated,
            attempts=attempts,
        )
        env = s["env"]
        params = {"max_tokens": s["max_tokens"], **_pairs(sampling, "--sampling")}
        for name in ("temperature", "top_p"):
            if s[name] is not None:
                params.setdefault(name, s[name])
        client = ApiClient(
            model,
            api_base=api_base,
            api_key_env=api_key_env,
            timeout_s=timeout_s,
            max_retries=retries,
            concurrency=s["concurrency"],
            sampling=params,
        )
        client.check_credentials()  # a hosted model without its key: one clear error (exit 2) before any episode
        summary = asyncio.run(
            run_eval(
                env,
                client,
                n=n,
                env_kwargs={**s["env_kwargs"], **_pairs(env_args, "--env-arg")},
                seed=s["seed"],
                max_turns=s["max_turns"],
                concurrency=s["concurrency"],
                episode_timeout_s=s["episode_timeout_s"],
                score_truncated=s["score_truncated"],
                min_reward=min_reward,
                out=out,
                on_episode=progress,
                attempts=s["attempts"],
                stop_if_all_failed=True,
                resume=resume,
                say=lambda line: console.print(line, highlight=False, markup=False),
            )
        )
    except AgentRLError as e:
        fail(e)
    tries = summary.get("attempts", 1)
    tab = Table(title=f"agentrl eval: {env} / {model}")
    tab.add_column("metric")
    tab.add_column("value", justify="right")
    for key in (
        "episodes",
        "solve_rate",
        "infra_failure_rate",
        "infra_failures",
        "reward_mean",
        "tool_use_rate",
        "turns_mean",
        "prompt_tokens",
        "completion_tokens",
        "chat_rows",
        "wall_s",
    ):
        v = summary[key]
        tab.add_row(key, f"{v:.3f}" if isinstance(v, float) else str(v))
        if key == "episodes" and tries > 1:
            tab.add_row("tasks x attempts", f"{summary['tasks']} x {tries}")
        if key == "solve_rate" and tries > 1:
            for k in [*(f"pass@{k}" for k in range(1, tries + 1)), f"avg@{tries}"]:
                tab.add_row(k, f"{summary[k]:.3f}")
    tab.add_row("outcomes", ", ".join(f"{k}={v}" for k, v in sorted(summary["outcomes"].items())))
    console.print(tab)
    files = summary["files"]
    console.print(
        f"wrote {files['chat']} ({summary['chat_rows']} chat rows), {files['episodes']}, {files['summary']}",
        highlight=False,
    )


def settings(config: list[str] | None, sets: list[str] | None, **flags) -> dict:
    """Each :data:`FIELDS` setting from its flag (None: not given), else the config when it names the
    field, else the default; plus ``env_kwargs``, the config's ``env.kwargs`` when its env is the one run."""
    cfg = load(config, sets)
    given = named(config, sets)
    out = {name: pick(flags.get(name), cfg, dotted, given, default) for name, (dotted, default) in FIELDS.items()}
    out["env"] = out["env"] or cfg.env.id
    # kwargs belong to their env (the config loader's rule): a --env other than env.id starts afresh
    out["env_kwargs"] = dict(cfg.env.kwargs) if out["env"] == cfg.env.id else {}
    return out
