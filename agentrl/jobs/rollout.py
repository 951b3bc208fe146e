"""The rollout job: plan -> engine + env + episode manager -> trajectories on disk + summary.

Owns the job of `agentrl rollout`: resolving its plan (``agentrl.config.plan``, job ``rollout``),
having ``agentrl.jobs.build`` build the env, the model and the engine ``engine.kind`` names (local
or SGLang), streaming trajectories to ``trajectories.jsonl`` as they finish (a crash loses nothing
already finished), writing the resolved config and metrics (in proxy mode with the agent
programs' counters; the recording endpoint is closed at the end), and the progress bar. Also
``tune_gc``, which every job's entry point calls. Does not define or build any of the pieces.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.agents.strategy import proxy_strategy_of
from agentrl.config.plan import Plan, resolve
from agentrl.config.schema import RunConfig, save_config, to_dict
from agentrl.engine.counters import EngineCounters
from agentrl.episodes.manager import EpisodeManager, make_specs
from agentrl.episodes.summary import RolloutMetrics
from agentrl.jobs.build import chat_tokenizer, env_factory, episode_manager, make_engine, model_dir
from agentrl.models.device import device_line
from agentrl.trajectory import Trajectory, json_text


def tune_gc() -> None:
    """Make Python's cyclic GC rare in rollout processes. Thousands of live episodes hold millions of
    small containers (token lists) that survive; with default thresholds, full collections rescan
    them all the time and halved episode-manager throughput at 16k concurrent episodes (P2 bench).
    Call once per process, from the job's entry point (a library should not change it on import)."""
    import gc

    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


async def collect(manager: EpisodeManager, specs, out_file: Path | None, progress: bool = True) -> list[Trajectory]:
    """Run ``specs`` and append each trajectory to ``out_file`` the moment it finishes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    specs = list(specs)
    results: list[Trajectory] = []
    fh = open(out_file, "a", encoding="utf-8") if out_file else None
    try:
        with Progress(
            TextColumn("[bold]episodes"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            disable=not progress,
            transient=False,
        ) as bar:
            task = bar.add_task("episodes", total=len(specs), status="")
            async for t in manager.stream(specs):
                results.append(t)
                if fh:
                    fh.write(json_text(t.to_dict()) + "\n")
                    fh.flush()
                m = manager.metrics
                bar.update(
                    task, advance=1, status=f"ok={m.outcomes.get('ok', 0)} turns/s={m.summary()['turns_per_s']:.1f}"
                )
    finally:
        if fh:
            fh.close()
    return results


def run_rollout(
    cfg: RunConfig | Plan, progress: bool = True, note: Callable[[str], None] = print
) -> tuple[list[Trajectory], RolloutMetrics, Path]:
    """Run ``cfg``'s rollout (its plan for job ``rollout``); returns the trajectories, their
    metrics and the output directory."""
    cfg = resolve(cfg, "rollout").cfg  # written as config.yaml: what really ran
    tune_gc()
    note(device_line(cfg))
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    factory = env_factory(cfg)
    if factory.isolation:
        note(factory.isolation)
    model_path = model_dir(cfg)
    tokenizer, chat = chat_tokenizer(cfg, model_path)
    note(chat.line())
    engine = make_engine(cfg, model_path)

    async def main() -> tuple[list[Trajectory], RolloutMetrics, dict]:
        await engine.start()
        proxy = None
        try:
            manager = episode_manager(cfg, engine, factory, tokenizer)
            proxy = proxy_strategy_of(manager)
            if proxy is not None and (line := proxy.isolation_line()):
                note(line)
            specs = make_specs(cfg.rollout.num_prompts, cfg.rollout.group_size, cfg.rollout.seed)
            trajs_path = out / "trajectories.jsonl"
            trajs_path.unlink(missing_ok=True)
            trajs = await collect(manager, specs, trajs_path, progress)
            extra = {"agent": proxy.totals()} if proxy is not None else {}
            counts = EngineCounters(engine).now()
            return trajs, manager.metrics, {**extra, **({"engine": counts} if counts else {})}
        finally:
            if proxy is not None:  # its endpoint serves the engine: closed first
                await proxy.close()
            await engine.close()

    trajs, metrics, agent = asyncio.run(main())
    summary: dict[str, Any] = {"model": str(model_path), **metrics.summary(), **agent, "config": to_dict(cfg)}
    (out / "metrics.json").write_text(json.dumps(summary, indent=2, default=str))
    return trajs, metrics, out
