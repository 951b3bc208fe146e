"""The plan of a job: a loaded config with every cross-field check passed and every auto field filled.

Owns ``resolve(cfg, job)``, the one place where a run config is checked field against field and
where null/``auto`` fields become the values the job will use. ``agentrl config`` prints its
output, ``agentrl run`` and ``agentrl rollout`` run it (``agentrl.jobs.run.Runner`` and
``agentrl.jobs.rollout.run_rollout`` resolve what they are given), and the ``config.yaml``
written beside a run or a rollout is its ``cfg``. Resolving is idempotent: a resolved config
resolves to itself, so a printed config can be fed back with ``-c``.

What it does, in order (every failure a ConfigError naming the field and the bad value):

1. ``model.device`` / ``model.dtype`` ``auto`` and the trainer's device fields that follow them
   (``agentrl.models.device.resolve_device``);
2. ``engine.urls``: only with ``engine.kind=sglang``, each an http(s) URL;
3. for ``run`` only (the sections a job does not use are left as given and not checked):
   ``algo.name`` a known preset (``agentrl.batches.samples.ALGOS``) and the null ``algo.*`` fields
   -> the preset's: ``credit``, ``whiten_advantages`` (on for ppo), ``dynamic_sampling`` (on for
   dapo), ``overlong_cache_len`` (``rollout.max_new_tokens // 5`` for dapo, else off; at most
   ``max_new_tokens``), ``kl_in_reward`` (0.001 for reinforce_pp, else 0); ``algo.kl_target``
   needs ``kl_in_reward > 0``; ``kl_in_reward > 0`` turns ``trainer.reference`` on;
   ``algo.reward_normalization=gdpo`` needs the grpo advantage and outcome credit, and
   ``algo.reward_weights`` (numbers >= 0) needs gdpo; ``algo.opd_coef`` null -> 1 under opd, else 0;
   on-policy distillation (``opd_coef`` > 0) needs ``algo.teacher`` and a teacher needs it; ``opd``
   needs outcome credit and ``opd_coef`` > 0; ``trainer.opd_coef`` / ``trainer.teacher_path`` are
   left to the run (``agentrl.jobs.build`` fills them from ``algo.*`` once the teacher is resolved);
   ``engine.weight_sync`` ``auto`` -> the sync kind (``agentrl.weights.factory.resolve_sync_kind``),
   nccl only on GPUs, ``engine.weights_dir`` null -> output_dir/weights for the disk sync;
   ``engine.cpu_threads`` null -> half the cores for the in-process engine on CPU, 0 (torch's
   default) whenever the engine does not share this process's CPU with the trainer or takes turns
   with it (``train.max_staleness`` 0);
   ``distributed: ray`` -> the Ray mode's own rule (``agentrl.distributed.compute.check``);
   ``monitor.pause_on`` known alert kinds; the null trainer fields (``lr``, ``norm_lr_scale``,
   ``lr_schedule``, ``min_lr_ratio`` from ``BUILTIN_RL`` for the built-in model, else the Trainer
   API's ``AUTO``; ``policy_loss``, ``clip_low``, ``clip_high`` the preset's where it sets them
   (dapo, gspo, cispo), else ``AUTO``'s; ``total_steps`` the run's optimizer steps; ``loss_agg``
   the preset's (gspo requires its own: another is rejected);
   ``loss_norm_len`` the most tokens an episode can sample), then ``TrainerConfig.check``;
   ``trainer.dual_clip_c`` only with ``policy_loss=ppo_clip`` (gspo and cispo have no dual clip);
   ``trainer.temperature`` must equal ``rollout.temperature``; a ratio mask
   (``trainer.rollout_correction`` icepop, mis, seq_reject) needs ``trainer.old_logprobs=current``
   (a run's samples carry no old logprobs, so with ``behaviour`` its ratio would be 1 on every token).

Does not touch the filesystem, the network or any model: a model directory, a replay run and the
Ray cluster are checked when the job builds them (``agentrl.jobs.build``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config.schema import RunConfig
from agentrl.distributed.compute import check
from agentrl.errors import ConfigError
from agentrl.models.device import resolve_device
from agentrl.observe.monitors import MONITORS
from agentrl.trainer.config import AUTO
from agentrl.warmstart.default_model import BUILTIN_RL
from agentrl.weights.factory import resolve_sync_kind

#: The jobs a plan can be made for.
JOBS = ("run", "rollout")
#: The ``trainer.rollout_correction`` modes that mask on the ratio pi_old / pi_engine.
MASKS = ("icepop", "mis", "seq_reject")


@dataclass(frozen=True)
class Plan:
    """A resolved config (``cfg``) for ``job``, with what it implies: the algorithm ``preset``
    (``agentrl.batches.samples.ALGOS``; None for a job that does not train)."""

    cfg: RunConfig
    job: str
    preset: Any = None

    @property
    def sync_kind(self) -> str:
        """The weight sync the run pushes through (``engine.weight_sync``, resolved)."""
        return self.cfg.engine.weight_sync

    @property
    def shaping(self):
        """What the run adds to the env's rewards before credit (``agentrl.batches.rewards``); the
        KL coefficient is the starting one (``algo.kl_target`` adapts it during the run)."""
        from agentrl.batches.rewards import RewardShaping  # lazy: pulls in torch

        a = self.cfg.algo
        return RewardShaping(
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            overlong_cache_len=a.overlong_cache_len,
            overlong_factor=a.overlong_factor,
            kl_coef=a.kl_in_reward or 0.0,
            kl_estimator=a.kl_reward_estimator,
            reward_normalization=a.reward_normalization,
            reward_weights=dict(a.reward_weights),
        )

    @property
    def eval_env_kwargs(self) -> dict:
        """The held-out eval's env kwargs: ``env.kwargs`` overridden by ``eval.env_kwargs``."""
        return {**self.cfg.env.kwargs, **self.cfg.eval.env_kwargs}


def resolve(cfg: RunConfig | Plan, job: str = "run", *, cores: int | None = None, found: Any = None) -> Plan:
    """The plan of ``job`` for ``cfg`` (see the module docstring); a Plan for ``job`` is returned as
    is. ``cores``: CPU cores for the auto ``engine.cpu_threads`` (default: this process's affinity);
    ``found``: the accelerators ``agentrl.models.device`` probes (default: this machine's)."""
    if isinstance(cfg, Plan):
        if cfg.job == job:
            return cfg
        cfg = cfg.cfg
    if job not in JOBS:
        raise ConfigError(f"job: {job!r} is not one of {list(JOBS)}")

    cfg = resolve_device(cfg, found)
    check_urls(cfg)
    if job != "run":
        return Plan(cfg, job)
    preset = _preset(cfg)
    engine = _engine(cfg, cores)
    if cfg.distributed == "ray":
        check(cfg, cfg.ray)
    _check_monitors(cfg)
    algo = resolve_algo(cfg, preset)
    trainer = resolve_trainer(cfg, preset)
    if (algo.kl_in_reward or 0.0) > 0 and not trainer.reference:
        trainer = dataclasses.replace(trainer, reference=True)  # the reference logprobs of the KL in the reward
    trainer.check()
    if trainer.temperature != cfg.rollout.temperature:
        raise ConfigError(
            f"trainer.temperature ({trainer.temperature}) must equal rollout.temperature "
            f"({cfg.rollout.temperature}): the trainer rescores tokens with the sampling distribution"
        )
    if trainer.rollout_correction in MASKS and trainer.old_logprobs != "current":
        raise ConfigError(
            f"trainer.rollout_correction: {trainer.rollout_correction!r} masks on pi_old / pi_engine, which is 1 "
            f"on every token with trainer.old_logprobs={trainer.old_logprobs!r} (a run's samples carry no old "
            "logprobs): set trainer.old_logprobs=current"
        )
    return Plan(dataclasses.replace(cfg, engine=engine, trainer=trainer, algo=algo), job, preset)


def check_urls(cfg: RunConfig) -> None:
    e = cfg.engine
    if e.kind != "sglang" and e.urls:
        raise ConfigError(f"engine.urls: {e.urls!r} needs engine.kind=sglang (got {e.kind!r})")
    for u in e.urls:
        if not isinstance(u, str) or not u.startswith(("http://", "https://")):
            raise ConfigError(f"engine.urls: {u!r} is not an http(s)://host:port URL")


def _preset(cfg: RunConfig):
    from agentrl.batches.samples import ALGOS  # lazy: pulls in torch

    if cfg.algo.name not in ALGOS:
        raise ConfigError(f"algo.name: {cfg.algo.name!r} is not one of {sorted(ALGOS)}")
    return ALGOS[cfg.algo.name]


def _engine(cfg: RunConfig, cores: int | None):
    """``cfg.engine`` with the weight sync, its directory and the CPU threads resolved."""
    e = cfg.engine
    device = "cpu" if cfg.model.device == "cpu" else "gpu"
    kind = resolve_sync_kind(e.weight_sync, e.kind, device)
    if kind == "distributed" and e.sync_backend == "nccl" and device == "cpu":
        raise ConfigError("engine.sync_backend: 'nccl' needs GPUs (model.device='cpu'); use gloo or weight_sync=disk")
    weights_dir = e.weights_dir
    if kind == "disk" and weights_dir is None:
        weights_dir = str(Path(cfg.output_dir) / "weights")
    return dataclasses.replace(e, weight_sync=kind, weights_dir=weights_dir, cpu_threads=cpu_threads(cfg, cores))


def cpu_threads(cfg: RunConfig, cores: int | None = None) -> int:
    """Torch intra-op threads for ``agentrl run`` (0: leave torch's default). Only the in-process
    engine on CPU shares the process with the trainer; both compute at once in their own threads, and
    every thread that enters a parallel region gets its own OpenMP team, so null (auto) splits the cores;
    on-policy (``train.max_staleness`` 0) they take turns, so null leaves each every core."""
    n = cfg.engine.cpu_threads
    if n == 0 or cfg.engine.kind != "local" or cfg.model.device != "cpu" or cfg.distributed == "ray":
        return 0
    if n is not None:
        return n
    if cfg.train.max_staleness == 0:
        return 0
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return max(1, cores // 2)


def _check_monitors(cfg: RunConfig) -> None:
    bad = [k for k in cfg.monitor.pause_on if k not in MONITORS]
    if bad:
        raise ConfigError(f"monitor.pause_on: {bad} not among {list(MONITORS)}")


def resolve_algo(cfg: RunConfig, preset):
    """``cfg.algo`` with its null fields chosen by the preset (see the module docstring)."""
    a, mnt = cfg.algo, cfg.rollout.max_new_tokens
    cache = a.overlong_cache_len
    if cache is None and preset.overlong:
        cache = mnt // 5
    if cache is not None and cache > mnt:
        raise ConfigError(
            f"algo.overlong_cache_len: {cache} exceeds rollout.max_new_tokens={mnt} (the soft zone "
            "is the last overlong_cache_len tokens before the limit)"
        )
    kl = a.kl_in_reward if a.kl_in_reward is not None else preset.kl_in_reward
    if a.kl_target is not None and kl <= 0:
        raise ConfigError(
            f"algo.kl_target: {a.kl_target} adapts the KL-in-reward coefficient, but "
            f"algo.kl_in_reward is {kl} (set a starting coefficient > 0)"
        )
    if a.kl_target is not None and a.kl_target <= 0:
        raise ConfigError(f"algo.kl_target: {a.kl_target} must be > 0 (null: a fixed coefficient)")
    _check_reward_normalization(a, preset, a.credit or preset.credit)
    opd = a.opd_coef if a.opd_coef is not None else preset.opd_coef
    _check_opd(cfg, opd, a.credit or preset.credit)
    pick = lambda v, d: d if v is None else v  # noqa: E731
    return dataclasses.replace(
        a,
        credit=a.credit or preset.credit,
        whiten_advantages=pick(a.whiten_advantages, preset.whiten_advantages),
        dynamic_sampling=pick(a.dynamic_sampling, preset.dynamic_sampling),
        overlong_cache_len=cache,
        kl_in_reward=float(kl),
        opd_coef=float(opd),
    )


def _check_opd(cfg: RunConfig, opd: float, credit: str) -> None:
    """On-policy distillation: a teacher exactly when ``opd`` > 0; ``opd`` pure distillation needs
    outcome credit (its advantage is 0) and a weight; the trainer's OPD fields are the run's to fill."""
    a, t = cfg.algo, cfg.trainer
    if t.opd_coef or t.teacher_path:
        raise ConfigError(
            f"trainer.opd_coef / trainer.teacher_path: {t.opd_coef!r} / {t.teacher_path!r} are set by `agentrl run` "
            "from algo.opd_coef and algo.teacher (which also checks the teacher's tokenizer): set those instead"
        )
    if a.name == "opd" and opd <= 0:
        raise ConfigError(f"algo.opd_coef: {opd} with algo.name=opd (pure distillation) leaves nothing to train")
    if opd > 0 and not a.teacher:
        raise ConfigError(
            f"algo.teacher: null, but on-policy distillation is on (algo.name={a.name!r}, algo.opd_coef={opd}): "
            "name the teacher model (a local HF directory, a GGUF file or a Hub id)"
        )
    if a.teacher and opd <= 0:
        raise ConfigError(
            f"algo.teacher: {a.teacher!r} is only used by on-policy distillation, which is off "
            "(algo.opd_coef 0): set algo.opd_coef > 0 or algo.name=opd, or leave algo.teacher null"
        )
    if a.name == "opd" and credit != "outcome":
        raise ConfigError(
            f"algo.credit: {credit!r} with algo.name=opd, which has no reward advantage to assign (the teacher's "
            "per-token term is its signal); to mix RL and distillation set algo.opd_coef beside an RL algorithm"
        )


def _check_reward_normalization(a, preset, credit: str) -> None:
    """``algo.reward_weights`` numbers >= 0 and only with gdpo; gdpo only with grpo + outcome credit."""
    for name, w in a.reward_weights.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"algo.reward_weights: {name!r} is not a component name")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ConfigError(f"algo.reward_weights.{name}: {w!r} must be a finite number >= 0")
    if a.reward_normalization != "gdpo":
        if a.reward_weights:
            raise ConfigError(
                f"algo.reward_weights: {dict(a.reward_weights)!r} weighs reward components under "
                f"algo.reward_normalization=gdpo, but it is {a.reward_normalization!r}"
            )
        return
    if preset.advantage != "grpo":
        raise ConfigError(
            f"algo.reward_normalization: 'gdpo' normalises each reward component with GRPO's group mean and std, "
            f"but algo.name={a.name!r} estimates advantages with {preset.advantage!r} (use grpo, dapo, gspo or cispo)"
        )
    if credit != "outcome":
        raise ConfigError(
            f"algo.reward_normalization: 'gdpo' gives each episode one advantage from its reward components "
            f"(outcome credit), but algo.credit is {credit!r}"
        )


def resolve_trainer(cfg: RunConfig, preset):
    """``cfg.trainer`` with its null ("auto") fields chosen for this run (see the module docstring)."""
    t = cfg.trainer
    chosen = {
        **AUTO,
        **(BUILTIN_RL if cfg.model.path is None else {}),
        **preset.trainer,
        "total_steps": cfg.train.steps * t.ppo_epochs * t.mini_batches,
    }
    auto = {k: v for k, v in chosen.items() if getattr(t, k) is None}
    if preset.fixed_aggregation and t.loss_agg not in (None, preset.aggregation):
        raise ConfigError(
            f"trainer.loss_agg: {t.loss_agg!r} with algo.name={cfg.algo.name!r}, which is defined with "
            f"{preset.aggregation!r} (leave trainer.loss_agg null)"
        )
    loss = t.policy_loss or chosen["policy_loss"]
    if t.dual_clip_c is not None and loss in ("gspo", "cispo"):
        raise ConfigError(
            f"trainer.dual_clip_c: {t.dual_clip_c} with policy_loss={loss!r}, which has no dual clip "
            "(it bounds ppo_clip's loss for negative advantages; leave it null)"
        )
    agg = t.loss_agg or preset.aggregation
    norm = t.loss_norm_len
    if agg == "seq-mean-token-sum-norm" and norm is None:
        norm = min(cfg.rollout.max_context, cfg.rollout.max_new_tokens * cfg.rollout.max_turns)
    return dataclasses.replace(t, loss_agg=agg, loss_norm_len=norm, **auto)
