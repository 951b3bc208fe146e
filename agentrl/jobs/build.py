"""What a job's plan builds: the model directory, envs, engines, weight syncs and the compute.

Owns turning a resolved plan (``agentrl.config.plan``) into objects, in one place for every job:
``model_dir`` (the built-in model or a checked local directory), ``EnvFactory`` (the run's envs,
one built at once to fail fast), ``make_engine`` (the engine ``engine.kind`` names: the in-process
LocalEngine, or an SGLangEngine attached to ``engine.urls`` / launching ``engine.num_servers``),
``make_sync`` (the WeightSync of ``engine.weight_sync``), ``with_teacher`` (the trainer's
distillation fields from ``algo.teacher`` resolved and checked) and ``start_compute``
(``distributed: local`` -> a LocalCompute of the pieces above and a Trainer; ``ray`` -> a
RayCompute, whose actors build their engines from the same config). Does not check or fill config fields (the plan did)
and does not implement engines, syncs, envs or compute objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.agents.proxy import ProxyEndpoint
from agentrl.agents.strategy import ProxyStrategy
from agentrl.config.plan import Plan
from agentrl.config.schema import RunConfig
from agentrl.distributed import RayCompute
from agentrl.episodes.manager import EpisodeManager
from agentrl.episodes.tokenizer import load_chat_tokenizer
from agentrl.errors import ConfigError
from agentrl.jobs.local_compute import LocalCompute
from agentrl.models.teacher import resolve_teacher
from agentrl.sandbox.base import env_isolation_line
from agentrl.warmstart.default_model import resolve_model_path
from agentrl.weights.drain import with_partial_rollouts
from agentrl.weights.factory import make_weight_sync

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentrl.engine.base import Engine


def model_dir(cfg: RunConfig) -> Path:
    """The model directory the job loads: the built-in model for ``model.path: null`` (built and
    cached on first use), else ``model.path`` (a local directory, checked, or a Hub id fetched at
    ``model.revision``; ConfigError if unusable)."""
    return resolve_model_path(cfg.model.path, cfg.model.revision)


def chat_tokenizer(cfg: RunConfig, model_path: Path):
    """The tokenizer the job renders chats with (``model.chat_template`` and ``model.tool_prompt``
    applied; ``agentrl.episodes.tokenizer``) and the ``ChatSetup`` saying what was chosen."""
    return load_chat_tokenizer(model_path, cfg.model.chat_template, cfg.model.tool_prompt, model=cfg.model.path)


class EnvFactory:
    """Builds the run's envs (``factory()``). One is built at once and closed, to fail fast on a bad
    env or kwargs before any engine work, and to read ``isolation``: the ``sandbox: ...`` line of
    its sandbox (None for an env without one), which ``agentrl run``/``rollout`` print at start."""

    def __init__(self, env_id: str, kwargs: dict) -> None:
        from agentrl.envs.registry import make  # lazy: pulls in gymnasium

        self.env_id, self.kwargs = env_id, dict(kwargs)
        env = make(env_id, **self.kwargs)
        try:
            self.isolation = env_isolation_line(env)
        finally:
            env.close()

    def __call__(self) -> Any:
        from agentrl.envs.registry import make  # lazy: pulls in gymnasium

        return make(self.env_id, **self.kwargs)


def env_factory(cfg: RunConfig) -> EnvFactory:
    """The training (or rollout) env: ``env.id`` with ``env.kwargs``."""
    return EnvFactory(cfg.env.id, cfg.env.kwargs)


def eval_env_factory(plan: Plan):
    """The held-out eval's env: ``env.id`` with ``plan.eval_env_kwargs`` (built per episode, not probed)."""
    from agentrl.envs.registry import check_split, make  # lazy: pulls in gymnasium

    env_id, kwargs = plan.cfg.env.id, plan.eval_env_kwargs
    check_split(env_id, kwargs)  # an env without a held-out split fails here, before training, naming the choice
    return lambda: make(env_id, **kwargs)


def make_engine(cfg: RunConfig, model_path: Path):
    """The rollout engine ``cfg.engine.kind`` names, not started yet."""
    if cfg.engine.kind == "sglang":
        return _sglang_engine(cfg, model_path)
    from agentrl.engine.local.engine import LocalEngine  # lazy: pulls in torch

    return LocalEngine.from_pretrained(
        str(model_path),
        device=cfg.model.device,
        dtype=cfg.model.dtype,
        max_batch_size=cfg.engine.max_batch_size,
        max_context=cfg.rollout.max_context,
        prefix_cache_tokens=cfg.engine.prefix_cache_tokens,
        linear_dtype=None if cfg.engine.linear_dtype == "auto" else cfg.engine.linear_dtype,
    )


def _sglang_engine(cfg: RunConfig, model_path: Path):
    from agentrl.engine.sglang.engine import SGLangEngine  # lazy: pulls in httpx

    if cfg.engine.urls:
        return SGLangEngine(urls=cfg.engine.urls, max_context=cfg.rollout.max_context)
    device = "cpu" if cfg.model.device == "cpu" else "cuda"
    return SGLangEngine.launch(
        str(model_path),
        num_servers=cfg.engine.num_servers,
        device=device,
        max_total_tokens=cfg.engine.max_total_tokens,
        max_context=cfg.rollout.max_context,
    )


def make_sync(plan: Plan, engine, model_path: Path):
    """The WeightSync ``engine.weight_sync`` (resolved by the plan) names, pushing into ``engine``."""
    e = plan.cfg.engine
    kwargs: dict[str, Any] = {}
    if plan.sync_kind == "disk":
        assert e.weights_dir is not None  # the plan fills it for the disk sync
        kwargs = {"dir": Path(e.weights_dir), "model_path": model_path}
    elif plan.sync_kind == "distributed":
        kwargs = {"backend": e.sync_backend}
    return make_weight_sync(plan.sync_kind, engine, **kwargs)


def with_teacher(cfg: RunConfig, model_path: Path) -> RunConfig:
    """``cfg`` with ``trainer.opd_coef`` / ``trainer.teacher_path`` filled from ``algo.opd_coef`` and
    ``algo.teacher`` (resolved like ``model.path``; ConfigError naming both models when it does not
    share the tokenizer of the student at ``model_path``); ``cfg`` itself without distillation."""
    a = cfg.algo
    if not a.opd_coef:
        return cfg
    assert a.teacher is not None  # the plan refuses opd_coef without a teacher
    teacher = resolve_teacher(a.teacher, model_path, cfg.model.path or "the built-in model")
    return dataclasses.replace(
        cfg, trainer=dataclasses.replace(cfg.trainer, opd_coef=a.opd_coef, teacher_path=str(teacher))
    )


def start_compute(plan: Plan, model_path: Path, make_env, tokenizer, resume: Path | None = None):
    """The run's compute, its trainer (with its distillation teacher: ``with_teacher``) loaded from
    ``resume`` (a checkpoint, or None) before the in-process engine is built; returns (compute, the
    checkpoint's extra state or {}). On failure nothing it started is left running."""
    cfg = with_teacher(plan.cfg, model_path)
    if cfg.distributed == "ray":
        if cfg.agent.kind != "builtin":
            raise ConfigError(
                f"agent.kind={cfg.agent.kind!r} runs with distributed=local only (the Ray "
                "mode's episode actors run the built-in loop)"
            )

        compute = RayCompute.start(cfg, model_path, critic=plan.preset.critic)
        try:
            return compute, compute.trainer.load(resume) if resume else {}
        except BaseException:
            compute.close()
            raise
    from agentrl.trainer import Trainer  # lazy: pulls in torch

    trainer = Trainer(str(model_path), cfg.trainer, critic=plan.preset.critic)
    try:
        extra = trainer.load(resume) if resume else {}
        engine = with_partial_rollouts(make_engine(cfg, model_path), cfg.rollout.partial_rollouts)
    except BaseException:
        trainer.close()
        raise
    episodes = episode_manager(cfg, engine, make_env, tokenizer)
    return LocalCompute(engine=engine, trainer=trainer, episodes=episodes), extra


def episode_manager(
    cfg: RunConfig, engine: Engine, make_env: Callable[[], Any], tokenizer: PreTrainedTokenizerBase
) -> EpisodeManager:
    """The run's EpisodeManager: the built-in turn loop, or (``agent.kind: proxy``) outside agent
    programs sampling through a recording OpenAI-compatible endpoint (``agentrl.agents``)."""
    strategy = None
    if cfg.agent.kind == "proxy":
        strategy = ProxyStrategy(cfg.agent, ProxyEndpoint(cfg.agent.model_name, max_tokens=cfg.rollout.max_new_tokens))
    return EpisodeManager(engine, make_env, tokenizer, cfg.rollout, env_id=cfg.env.id, strategy=strategy)
