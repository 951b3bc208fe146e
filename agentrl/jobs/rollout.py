"""The rollout job: config -> engine + env + episode manager -> trajectories on disk + summary.

Owns wiring the pieces for `agentrl rollout` (and, later, the rollout half of `agentrl run`):
resolving the model, building the engine, streaming trajectories to ``trajectories.jsonl`` as they
finish (a crash loses nothing already finished), writing the resolved config and metrics, and the
progress bar. Does not define any of the pieces.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable

from agentrl.config.schema import RunConfig, save_config, to_dict
from agentrl.episodes.manager import EpisodeManager, make_specs
from agentrl.observe.metrics import RolloutMetrics
from agentrl.sandbox.base import env_isolation_line
from agentrl.trajectory import Trajectory, json_text

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def tune_gc() -> None:
    """Make Python's cyclic GC rare in rollout processes. Thousands of live episodes hold millions of
    small containers (token lists) that survive; with default thresholds, full collections rescan
    them all the time and halved episode-manager throughput at 16k concurrent episodes (P2 bench).
    Call once per process, from the job's entry point (a library should not change it on import)."""
    import gc

    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def build_engine(cfg: RunConfig, model_path: Path):
    import torch

    from agentrl.engine.local import LocalEngine

    return LocalEngine.from_pretrained(str(model_path), device=cfg.model.device,
                                       dtype=getattr(torch, _DTYPES[cfg.model.dtype]),
                                       max_batch_size=cfg.engine.max_batch_size,
                                       max_context=cfg.rollout.max_context)


class EnvFactory:
    """Builds the run's envs (``factory()``). One is built at once and closed, to fail fast on a bad
    env or kwargs before any engine work, and to read ``isolation``: the ``sandbox: ...`` line of
    its sandbox (None for an env without one), which ``agentrl run``/``rollout`` print at start."""

    def __init__(self, env_id: str, kwargs: dict) -> None:
        from agentrl.envs.registry import make

        self.env_id, self.kwargs = env_id, dict(kwargs)
        env = make(env_id, **self.kwargs)
        try:
            self.isolation = env_isolation_line(env)
        finally:
            env.close()

    def __call__(self) -> Any:
        from agentrl.envs.registry import make

        return make(self.env_id, **self.kwargs)


def env_factory(cfg: RunConfig) -> EnvFactory:
    return EnvFactory(cfg.env.id, cfg.env.kwargs)


async def collect(manager: EpisodeManager, specs, out_file: Path | None, progress: bool = True) -> list[Trajectory]:
    """Run ``specs`` and append each trajectory to ``out_file`` the moment it finishes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    specs = list(specs)
    results: list[Trajectory] = []
    fh = open(out_file, "a", encoding="utf-8") if out_file else None
    try:
        with Progress(TextColumn("[bold]episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[status]}"), disable=not progress, transient=False) as bar:
            task = bar.add_task("episodes", total=len(specs), status="")
            async for t in manager.stream(specs):
                results.append(t)
                if fh:
                    fh.write(json_text(t.to_dict()) + "\n")
                    fh.flush()
                m = manager.metrics
                bar.update(task, advance=1, status=f"ok={m.outcomes.get('ok', 0)} turns/s={m.summary()['turns_per_s']:.1f}")
    finally:
        if fh:
            fh.close()
    return results


def run_rollout(cfg: RunConfig, progress: bool = True,
                note: Callable[[str], None] = print) -> tuple[list[Trajectory], RolloutMetrics, Path]:
    from transformers import AutoTokenizer

    from agentrl.warmstart.default_model import resolve_model_path

    tune_gc()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    factory = env_factory(cfg)
    if factory.isolation:
        note(factory.isolation)
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    engine = build_engine(cfg, model_path)

    async def main() -> tuple[list[Trajectory], RolloutMetrics]:
        await engine.start()
        try:
            manager = EpisodeManager(engine, factory, tokenizer, cfg.rollout, env_id=cfg.env.id)
            specs = make_specs(cfg.rollout.num_prompts, cfg.rollout.group_size, cfg.rollout.seed)
            trajs_path = out / "trajectories.jsonl"
            trajs_path.unlink(missing_ok=True)
            trajs = await collect(manager, specs, trajs_path, progress)
            return trajs, manager.metrics
        finally:
            await engine.close()

    trajs, metrics = asyncio.run(main())
    summary: dict[str, Any] = {"model": str(model_path), **metrics.summary(), "config": to_dict(cfg)}
    (out / "metrics.json").write_text(json.dumps(summary, indent=2, default=str))
    return trajs, metrics, out
