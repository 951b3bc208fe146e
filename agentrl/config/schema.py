"""One typed config tree for every agentrl command.

Owns: the dataclasses of the tree (every field documented through ``doc()``; sections that belong
to one part live beside it and are re-exported here: ``rollout`` in ``agentrl.episodes.config``,
``trainer`` in ``agentrl.trainer.config``, ``ray`` in ``agentrl.distributed.config``, ``monitor``
in ``agentrl.observe.monitors``, ``sft`` (read by ``agentrl sft`` only) in ``agentrl.warmstart.config``), loading
from YAML files in ``configs/``, ``--set a.b=c``
overrides, per-field validation that names the field and the bad value (the rules of
``agentrl.common.typed_tree``; unreadable, binary or too deeply nested files and values rejected
through ``agentrl.common.bounded``), rejection of unknown keys, and dumping a tree.

How layers combine (``load_config``): defaults <- the env's run recipe (``agentrl.envs.recipes``: the
layer an env such as ``textworld`` registers, laid down when the merged ``env.id`` names it) <-
``base`` (a command's own defaults) <- each YAML file in order <- ``given`` (the options given on the
command line, e.g. ``-o``, ``-g``) <- each ``--set`` in order. A mapping
merges into the one below it key by key at every depth, ``env.kwargs`` included (``--set
env.kwargs.split=eval --set env.kwargs.difficulty=3`` keeps both); an empty mapping (``--set
env.kwargs={}``) clears what the layers below set; any other value replaces. One exception: a layer
that names a different ``env.id`` than the layers below starts ``env.kwargs`` afresh from its own
(kwargs belong to their env).

Does not check one field against another nor fill ``auto``/null fields (``agentrl.config.plan``
does, once, for every job), and does not know how the values are used.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from agentrl.agents.config import AgentConfig
from agentrl.common.bounded import BadText, decode, parse_text
from agentrl.common.fields import doc
from agentrl.common.typed_tree import build as _build
from agentrl.common.typed_tree import deep_merge as _deep_merge
from agentrl.common.typed_tree import one_line as _one_line
from agentrl.common.typed_tree import parse_override
from agentrl.distributed.config import RayConfig
from agentrl.episodes.config import RolloutConfig
from agentrl.errors import ConfigError
from agentrl.observe.monitors import MonitorConfig
from agentrl.trainer.config import TrainerConfig
from agentrl.warmstart.config import SFTConfig

__all__ = [
    "AgentConfig",
    "AlgoConfig",
    "EngineConfig",
    "EnvConfig",
    "EvalConfig",
    "LoggingConfig",
    "ModelConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainLoopConfig",
    "doc",
    "field_docs",
    "load_config",
    "merge_layer",
    "parse_override",
    "save_config",
    "to_dict",
]


@dataclass
class ModelConfig:
    path: str | None = doc(
        None,
        "A local HF model directory, a GGUF file (or a directory holding exactly one; converted once into an "
        "HF directory cached under $AGENTRL_CACHE/gguf by the file's sha256), or a Hugging Face Hub id "
        "'org/name' (optionally 'org/name@revision') downloaded once into the standard HF cache (HF_HUB_CACHE / "
        "HF_HOME; HF_TOKEN for gated or private models; HF_HUB_OFFLINE=1 uses the cache only). null builds and "
        "caches the built-in tiny model.",
    )
    revision: str | None = doc(
        None, "Hub models: the branch, tag or commit to pin (null: 'main', or the '@revision' in model.path)."
    )
    chat_template: str | None = doc(
        None,
        "The chat template conversations are rendered with: a built-in name ('chatml', 'qwen2_5') or the path "
        "of a jinja file; null: the model's own (a model without one must name one here).",
    )
    tool_prompt: Literal["auto", "template", "agentrl", "none"] = doc(
        "auto",
        "How tool schemas reach the model: 'template' (the chat template's own tool rendering), 'agentrl' "
        "(agentrl's Hermes-format block in the system message: <tools> schemas, calls as <tool_call>{name, "
        "arguments}</tool_call>; agentrl/templates/tool_prompt.jinja), 'none' (not shown); auto: template "
        "when it renders tools, else agentrl.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = doc(
        "auto",
        "Compute dtype: the engine's weights and the trainer's forward/backward when trainer.param_dtype "
        "is auto (trainer master weights and gradient reduction stay float32). auto: bfloat16 on CUDA, "
        "float32 on CPU.",
    )
    device: str = doc(
        "auto",
        "Torch device of the local engine and the trainer ('auto', 'cpu', 'cuda', 'cuda:1'). auto: cuda "
        "when a CUDA GPU is visible, else cpu. The choice is printed at start and written in config.yaml.",
    )


@dataclass
class EngineConfig:
    kind: Literal["local", "sglang"] = doc(
        "local", "Rollout engine: 'local' (in-process HF transformers) or 'sglang' (SGLang servers over HTTP)."
    )
    max_batch_size: int = doc(128, "Most sequences decoded together by the local engine.", min=1)
    prefix_cache_tokens: int = doc(
        32768,
        "kind=local: tokens whose K/V the engine keeps between an episode's turns (LRU over episodes), so a "
        "turn prefills only what it adds to the last prompt and completion; 0 turns the cache off.",
        min=0,
    )
    linear_dtype: Literal["auto", "float32", "bfloat16", "float16"] = doc(
        "auto",
        "kind=local: dtype of the linear layers' weights and matrix products; the activations, attention, K/V "
        "and logits keep model.dtype (each layer casts its input down and its output back). bfloat16 under a "
        "float32 model on a CPU with bfloat16 matrix units (AVX512-BF16, AMX) decodes faster with half the "
        "weight memory, where a whole bfloat16 engine is slower (CPU attention in bfloat16; BENCHMARKS.md). "
        "auto: model.dtype (no conversion).",
    )
    urls: list = doc(
        [], "kind=sglang: attach to these running SGLang servers (http://host:port); empty launches num_servers."
    )
    num_servers: int = doc(
        1, "kind=sglang without urls: SGLang servers to launch on model.path (stopped at the end).", min=1
    )
    max_total_tokens: int = doc(
        32768, "kind=sglang, launched servers: KV-cache tokens per server (--max-total-tokens).", min=64
    )
    weight_sync: Literal["auto", "inprocess", "disk", "tensor", "distributed", "object_store"] = doc(
        "auto",
        "How new weights reach the engine: inprocess (local engine), disk (safetensors + "
        "/update_weights_from_disk), tensor (/update_weights_from_tensor, colocated), distributed "
        "(/update_weights_from_distributed over a process group), object_store (distributed=ray: Ray's "
        "object store to each node, written to its local disk: no shared filesystem); auto = inprocess for "
        "local, disk for sglang on CPU, distributed for sglang on GPUs.",
    )
    sync_backend: Literal["nccl", "gloo"] = doc(
        "nccl", "weight_sync=distributed: process-group backend (nccl on GPUs; gloo also works on CPU)."
    )
    weights_dir: str | None = doc(None, "weight_sync=disk: where weight dirs are written (null: output_dir/weights).")
    cpu_threads: int | None = doc(
        None,
        "agentrl run with the local engine on CPU: torch intra-op threads. The engine decodes while the "
        "trainer steps, each with its own OpenMP team, so null (auto) gives each half the cores (at least 1); "
        "on 2 cores that made a default step 14% faster (BENCHMARKS.md P7). On-policy (train.max_staleness=0) "
        "they take turns, so null keeps torch's default (every core): a TextWorld step 24% faster on 2 cores. "
        "0 keeps torch's default.",
        min=0,
    )
    lend_idle_cores: bool = doc(
        False,
        "agentrl run with the local engine on CPU and engine.cpu_threads > 0: while only one of the engine and "
        "the trainer computes (an evaluation, a wait for rollouts, the engine idle at the staleness bound) it "
        "uses every core of the process, and engine.cpu_threads while both compute (the trainer resizes its "
        "thread team before each micro-batch, the engine before each step). false: each keeps "
        "engine.cpu_threads throughout.",
    )


@dataclass
class EnvConfig:
    id: str = doc("code_exec", "Registered env id (see `agentrl envs`).")
    kwargs: dict = doc(
        {},
        "Keyword arguments passed to agentrl.make(id, **kwargs). Layers merge key by key "
        "(--set env.kwargs.difficulty=3 keeps the other keys); --set env.kwargs={} clears them; "
        "a layer that changes env.id starts them afresh.",
    )


@dataclass
class AlgoConfig:
    name: Literal[
        "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "ppo", "dapo", "gspo", "cispo", "opd"
    ] = doc(
        "grpo",
        "RL algorithm preset (grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, ppo, dapo, gspo, "
        "cispo, opd): advantage estimator + credit mode + aggregation (+ critic for ppo), and the "
        "trainer fields and extras it implies where they are left null: dapo = ppo_clip with clip-higher "
        "(clip_low 0.2, clip_high 0.28) + token-mean + dynamic sampling + soft overlong punishment; gspo = "
        "policy_loss gspo (clip 3e-4/4e-4) with seq-mean-token-mean; cispo = policy_loss cispo (no lower "
        "bound, clip_high 0.2); reinforce_pp = batch-normalised returns with KL in the reward; "
        "reinforce_pp_baseline = group mean subtracted, then batch-normalised; ppo = turn-level GAE "
        "with a critic and whitened advantages; opd = pure on-policy distillation from algo.teacher (no "
        "reward advantage, token-mean, algo.opd_coef 1).",
    )
    credit: Literal["outcome", "turn_return", "turn_gae", "gigpo"] | None = doc(
        None,
        "Override the preset's credit mode: outcome broadcast, per-turn returns with a group baseline, turn-level "
        "GAE, or gigpo (episode-level group advantage + omega x step-level advantage within anchor-state groups; "
        "needs algo grpo or dr_grpo).",
    )
    gamma: float = doc(1.0, "Discount across turns (turn_return, turn_gae, gigpo's step returns).", min=0.0, max=1.0)
    lam: float = doc(0.95, "GAE lambda across turns (turn_gae).", min=0.0, max=1.0)
    gigpo_omega: float = doc(1.0, "Weight of GiGPO's step-level (anchor-state) advantage (credit=gigpo).", min=0.0)
    whiten_advantages: bool | None = doc(
        None,
        "credit=turn_gae: whiten the advantages over the batch's sampled tokens (zero mean, unit std; the "
        "critic's targets stay raw). null: on for ppo, off otherwise.",
    )
    turn_return_std: bool = doc(
        False, "credit=turn_return: divide each turn's advantage by the std of its group's returns at that turn."
    )
    reward_normalization: Literal["sum", "gdpo"] = doc(
        "sum",
        "How outcome credit turns rewards into an episode's advantage. 'sum' (default): the algo's estimator "
        "on the episode return (env rewards plus shaping). 'gdpo' (GDPO, multi-reward): each named component "
        "an env reports in its step info['reward_components'] (summed over the episode) is normalised within "
        "the group on its own with GRPO's mean/std, then they are added weighted by algo.reward_weights, so "
        "a component with a wide spread does not drown the others. An episode that reports none has one "
        "component 'reward' (its env return), so an env without components trains exactly as with 'sum'; "
        "the run's shaping terms (overlong, KL in the reward) are one more component 'shaping'. Needs an "
        "algo whose advantage is grpo (grpo, dapo, gspo, cispo) and credit outcome.",
    )
    reward_weights: dict = doc(
        {},
        "reward_normalization=gdpo: the weight of each named component's normalised advantage, e.g. "
        "{correct: 1.0, format: 0.2}; a component not listed weighs 1.0 (the default). Numbers >= 0.",
    )
    overlong_cache_len: int | None = doc(
        None,
        "DAPO soft overlong punishment: a turn that samples more than rollout.max_new_tokens - N tokens "
        "gets a reward penalty growing linearly to -overlong_factor at rollout.max_new_tokens (N = this). "
        "null: off, or rollout.max_new_tokens // 5 under dapo. 0: the hard form (-overlong_factor only at "
        "the limit).",
        min=0,
    )
    overlong_factor: float = doc(
        1.0, "The overlong penalty at rollout.max_new_tokens (see overlong_cache_len).", min=0.0
    )
    dynamic_sampling: bool | None = doc(
        None,
        "DAPO dynamic sampling: a finished group whose episode returns are all equal (no learning signal "
        "for a group baseline) is dropped and more prompts are drawn until train.groups_per_step groups "
        "with signal are in (counted in dapo/filtered_groups; its prompt is consumed, not trained, and "
        "recorded so in ledger.jsonl). null: on under dapo, off otherwise.",
    )
    max_draw_batches: int = doc(
        10,
        "Dynamic sampling's bound: once this many x train.groups_per_step groups were drawn for one step "
        "(with and without signal), the step trains on the groups with signal it has (fewer, or none) and "
        "counts it in dapo/short_steps (DAPO's max_num_gen_batches); 0 = no bound.",
        min=0,
    )
    kl_in_reward: float | None = doc(
        None,
        "Coefficient of the per-token KL(behaviour || reference) subtracted from each turn's reward before "
        "credit (kl_reward_estimator per token; loads the frozen reference model). 0 = off. null: 0.001 "
        "under reinforce_pp (with k1, as veRL's REINFORCE++ examples), 0 otherwise. Independent of "
        "trainer.kl_coef (KL in the loss).",
        min=0.0,
    )
    kl_reward_estimator: Literal["k1", "k2", "k3"] = doc(
        "k1", "Per-token KL estimate in the reward: k1 = logp - ref (REINFORCE++ and PPO-RLHF), k2, k3."
    )
    opd_coef: float | None = doc(
        None,
        "On-policy distillation beside any algorithm: loss = RL loss + opd_coef x the per-token reverse-KL "
        "term, where the frozen algo.teacher scores the student's own sampled tokens (action tokens only; "
        "tool output and prompts never count): REINFORCE on the advantage -(log p_student - log p_teacher) "
        "of each sampled token (agentrl.algos.opd_reverse_kl). Logged as opd/reverse_kl (the mean over "
        "action tokens) and time/teacher_s. null: 1 under algo.name=opd, 0 (off) otherwise.",
        min=0.0,
    )
    teacher: str | None = doc(
        None,
        "The distillation teacher (needed when opd_coef > 0 or algo.name=opd): a local HF model directory, a "
        "GGUF file or a Hub id 'org/name[@revision]', resolved as model.path is. It must share the student's "
        "tokenizer (checked at start) and is loaded frozen in the trainer process on the trainer's device; "
        "a teacher served by SGLang is not supported.",
    )
    kl_target: float | None = doc(
        None,
        "Adaptive KL-in-reward: after each step the coefficient is multiplied by 1 + e * n / kl_horizon, "
        "e = clip(KL / kl_target - 1, +-0.2), KL the step's mean summed per-episode KL, n its samples "
        "(Ziegler et al. 2019); kl_in_reward is the starting value. null: a fixed coefficient.",
        min=0.0,
    )
    kl_horizon: int = doc(10000, "Adaptive KL-in-reward: samples over which the error is corrected.", min=1)


@dataclass
class TrainLoopConfig:
    steps: int = doc(120, "Optimizer steps (policy versions) to train.", min=1)
    groups_per_step: int = doc(32, "Prompt groups (of rollout.group_size samples) per optimizer step.", min=1)
    max_staleness: int = doc(1, "k: no trained sample holds a token older than version - k (0 = synchronous).", min=0)
    max_prompt_drops: int = doc(
        0,
        "Abandon a prompt whose group the staleness bound dropped this many times (counted in "
        "staleness/abandoned_prompts, never rerun) instead of rerunning it for ever; 0 = no cap. Each rerun "
        "draws new samples, but a prompt on which the policy rambles to max_new_tokens in most samples is "
        "slow at any seed, so reruns are dropped far more often than first attempts (BENCHMARKS.md P7).",
        min=0,
    )
    checkpoint_every: int = doc(0, "Save a checkpoint every N steps (0 = only at the end).", min=0)
    resume: bool = doc(
        False,
        "Continue from the newest complete checkpoint in output_dir (exactly once: kept "
        "groups are trained, prompts in flight run again, logs rewound to its step).",
    )
    replay: str | None = doc(
        None,
        "Train on the batches another run recorded (its run dir, logged with "
        "logging.trajectories_per_step=-1) instead of generating: step N trains that "
        "run's step-N groups. Reproduces its updates bitwise; the engine only serves eval.",
    )


@dataclass
class EvalConfig:
    num_tasks: int = doc(
        500, "Held-out tasks per evaluation (0 = no evaluation); 500 gives a standard error of ~2 points.", min=0
    )
    every: int = doc(40, "Evaluate every N steps (and always before the first and after the last).", min=0)
    temperature: float = doc(1.0, "Sampling temperature for evaluation (0 = greedy).", min=0.0)
    env_kwargs: dict = doc({"split": "eval"}, "Env kwargs overriding env.kwargs for evaluation (held-out split).")
    attempts: int = doc(
        1,
        "`agentrl eval` only: attempts per task (--attempts); above 1 it reports pass@1..N (the unbiased "
        "estimator) and avg@N, an attempt that failed for an infrastructure reason counting as unsolved. "
        "The held-out eval of `agentrl run` makes one attempt per task.",
        min=1,
    )


@dataclass
class LoggingConfig:
    tensorboard: bool = doc(True, "Write TensorBoard event files under output_dir/tensorboard.")
    wandb_project: str | None = doc(None, "Log to this Weights & Biases project (needs `pip install wandb`).")
    trajectories_per_step: int = doc(
        32,
        "Trajectories saved per training step to output_dir/trajectories/ with "
        "their per-token advantages (for `agentrl report`); -1 all, 0 none.",
        min=-1,
    )


@dataclass
class RunConfig:
    output_dir: str = doc("runs/latest", "Where trajectories, metrics and the resolved config are written.")
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    distributed: Literal["local", "ray"] = doc(
        "local",
        "Orchestration: 'local' runs engine, episodes and trainer in this process; 'ray' runs them as "
        "Ray actors on placement groups (see ray.*; pip install 'agentrl[ray]').",
    )
    ray: RayConfig = field(default_factory=RayConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


# ------------------------------------------------------------------------------------------
def _read_file(p: Path) -> dict:
    """One YAML config file as a mapping; ConfigError naming the file for every way it can be unusable."""
    where = f"config file {str(p)!r}"
    if not p.exists():
        raise ConfigError(f"{where} does not exist")
    if p.is_dir():
        raise ConfigError(f"{where} is a directory, not a YAML file")
    try:
        loaded = parse_text(decode(p.read_bytes()), yaml.safe_load) or {}
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror or e}") from None
    except BadText as e:
        raise ConfigError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {_one_line(e)}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{where} must hold a mapping at top level")
    return loaded


def merge_layer(data: dict, layer: dict) -> dict:
    """One layer laid on the ones below (the rule in the module docstring)."""
    env = layer.get("env")
    if (
        isinstance(env, dict)
        and "id" in env
        and isinstance(data.get("env"), dict)
        and env["id"] != data["env"].get("id", EnvConfig.id)
    ):
        data = {**data, "env": {k: v for k, v in data["env"].items() if k != "kwargs"}}
    return _deep_merge(data, layer)


def load_config(
    files: Sequence[str | Path] = (), overrides: Sequence[str] = (), base: dict | None = None, given: dict | None = None
) -> RunConfig:
    """Merge defaults <- ``base`` <- YAML files (in order) <- ``given`` <- ``--set`` overrides (the
    rule in the module docstring), then validate every field. Cross-field checks and auto fields:
    ``agentrl.config.plan.resolve``."""
    data: dict = dict(base or {})
    for f in files:
        data = merge_layer(data, _read_file(Path(f)))
    if given:
        data = merge_layer(data, given)
    for o in overrides:
        data = merge_layer(data, parse_override(o))
    return _build(RunConfig, with_env_recipe(data))


def with_env_recipe(data: dict) -> dict:
    """``data`` laid on the run recipe of the env it names (``agentrl.envs.recipes``), if that env
    has one: the recipe sits right above the defaults, so every layer of the user's wins over it."""
    from agentrl.envs.registry import registered  # lazy: pulls in gymnasium

    env = data.get("env")
    env_id = env.get("id", EnvConfig.id) if isinstance(env, dict) else EnvConfig.id
    spec = registered().get(env_id) if isinstance(env_id, str) else None
    if spec is None or not spec.run_defaults:
        return data
    recipe = _deep_merge(spec.run_defaults, {"env": {"id": env_id}})
    return merge_layer(recipe, data)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def field_docs(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(dotted name, doc, default) for every leaf field, for `agentrl config --docs` and tests."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        name = f"{prefix}{f.name}"
        if is_dataclass(hints[f.name]):
            out.extend(field_docs(hints[f.name], name + "."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            out.append((name, f.metadata.get("doc", ""), default))
    return out
