"""One typed config tree for every agentrl command.

Owns: the dataclasses of the tree (every field documented through ``doc()``), loading from YAML
files in ``configs/``, ``--set a.b=c`` overrides, validation that names the field and the bad value
(every float finite, every int within 64 bits; unreadable, binary or too deeply nested files and
values rejected through ``agentrl.common.bounded``), rejection of unknown keys, and dumping the resolved tree. Does not know how the values are used.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from agentrl.common.bounded import BadText, decode, finite_error, parse_text
from agentrl.distributed.config import RayConfig
from agentrl.errors import ConfigError
from agentrl.common.fields import doc
from agentrl.observe.monitors import MonitorConfig
from agentrl.trainer.config import TrainerConfig
from agentrl.warmstart.config import SFTConfig


@dataclass
class ModelConfig:
    path: str | None = doc(
        None, "A local HF model directory, or a Hugging Face Hub id 'org/name' (optionally 'org/name@revision') "
              "downloaded once into the standard HF cache (HF_HUB_CACHE / HF_HOME; HF_TOKEN for gated or private "
              "models; HF_HUB_OFFLINE=1 uses the cache only). null builds and caches the built-in tiny model.")
    revision: str | None = doc(
        None, "Hub models: the branch, tag or commit to pin (null: 'main', or the '@revision' in model.path).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = doc(
        "auto", "Compute dtype: the engine's weights and the trainer's forward/backward when trainer.param_dtype "
                "is auto (trainer master weights and gradient reduction stay float32). auto: bfloat16 on CUDA, "
                "float32 on CPU.")
    device: str = doc(
        "auto", "Torch device of the local engine and the trainer ('auto', 'cpu', 'cuda', 'cuda:1'). auto: cuda "
                "when a CUDA GPU is visible, else cpu. The choice is printed at start and written in config.yaml.")


@dataclass
class EngineConfig:
    kind: Literal["local", "sglang"] = doc(
        "local", "Rollout engine: 'local' (in-process HF transformers) or 'sglang' (SGLang servers over HTTP).")
    max_batch_size: int = doc(128, "Most sequences decoded together by the local engine.", min=1)
    urls: list = doc([], "kind=sglang: attach to these running SGLang servers (http://host:port); empty launches num_servers.")
    num_servers: int = doc(1, "kind=sglang without urls: SGLang servers to launch on model.path (stopped at the end).", min=1)
    max_total_tokens: int = doc(32768, "kind=sglang, launched servers: KV-cache tokens per server (--max-total-tokens).", min=64)
    weight_sync: Literal["auto", "inprocess", "disk", "tensor", "distributed"] = doc(
        "auto", "How new weights reach the engine: inprocess (local engine), disk (safetensors + "
        "/update_weights_from_disk), tensor (/update_weights_from_tensor, colocated), distributed "
        "(/update_weights_from_distributed over a process group); auto = inprocess for local, disk for "
        "sglang on CPU, distributed for sglang on GPUs.")
    sync_backend: Literal["nccl", "gloo"] = doc(
        "nccl", "weight_sync=distributed: process-group backend (nccl on GPUs; gloo also works on CPU).")
    weights_dir: str | None = doc(None, "weight_sync=disk: where weight dirs are written (null: output_dir/weights).")
    cpu_threads: int | None = doc(
        None, "agentrl run with the local engine on CPU: torch intra-op threads. The engine decodes while the "
        "trainer steps, each with its own OpenMP team, so null (auto) gives each half the cores (at least 1); "
        "on 2 cores that made a default step 14% faster (BENCHMARKS.md P7). 0 keeps torch's default.", min=0)


@dataclass
class EnvConfig:
    id: str = doc("code_exec", "Registered env id (see `agentrl envs`).")
    kwargs: dict = doc({}, "Keyword arguments passed to agentrl.make(id, **kwargs).")


@dataclass
class RolloutConfig:
    num_prompts: int = doc(8, "Prompts (tasks) per rollout call; each is sampled group_size times.", min=1)
    group_size: int = doc(8, "Samples per prompt (G); a group shares one task.", min=1)
    max_turns: int = doc(8, "Assistant turns per episode before it ends as truncated_turns.", min=1)
    max_new_tokens: int = doc(256, "Most tokens sampled in one assistant turn.", min=1)
    max_context: int = doc(4096, "Token budget of a whole episode (prompt + all turns).", min=8)
    min_turn_tokens: int = doc(8, "A turn starts only if this many tokens still fit; else context_overflow.", min=1)
    score_truncated: bool = doc(False, "Still hand a turn cut at its token limit to env.step and keep its reward (outcome stays truncated_length).")
    max_obs_chars: int = doc(4000, "Cap on each observation message's characters before rendering.", min=1)
    temperature: float = doc(1.0, "Sampling temperature (0 = greedy).", min=0.0)
    top_p: float = doc(1.0, "Nucleus sampling threshold in (0, 1].", min=0.0, max=1.0)
    top_k: int = doc(0, "Top-k filter (0 = off).", min=0)
    turn_timeout_s: float = doc(300.0, "Deadline for one turn's generation, and separately its env step.", min=0.001)
    episode_timeout_s: float = doc(3600.0, "Deadline for a whole episode (outcome 'deadline').", min=0.001)
    max_concurrency: int = doc(256, "Episodes in flight at once.", min=1)
    seed: int = doc(0, "Seeds task selection and per-episode sampling.")
    partial_rollouts: bool = doc(
        True, "Weight updates interrupt in-flight generations, swap weights and let them resume (a turn may "
        "hold tokens of two versions; the staleness bound uses the oldest). false: an update first drains "
        "(new generations wait, running ones finish) so every turn comes from one version, at the cost of "
        "waiting for the longest turn in flight.")


@dataclass
class AlgoConfig:
    name: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo"] = doc(
        "grpo", "RL algorithm preset: advantage estimator + credit mode + aggregation (+ critic for ppo).")
    credit: Literal["outcome", "turn_return", "turn_gae"] | None = doc(
        None, "Override the preset's credit mode: outcome broadcast, per-turn returns with a group baseline, turn-level GAE.")
    gamma: float = doc(1.0, "Discount across turns (turn_return, turn_gae).", min=0.0, max=1.0)
    lam: float = doc(0.95, "GAE lambda across turns (turn_gae).", min=0.0, max=1.0)


@dataclass
class TrainLoopConfig:
    steps: int = doc(120, "Optimizer steps (policy versions) to train.", min=1)
    groups_per_step: int = doc(32, "Prompt groups (of rollout.group_size samples) per optimizer step.", min=1)
    max_staleness: int = doc(1, "k: no trained sample holds a token older than version - k (0 = synchronous).", min=0)
    max_prompt_drops: int = doc(
        0, "Abandon a prompt whose group the staleness bound dropped this many times (counted in "
           "staleness/abandoned_prompts, never rerun) instead of rerunning it for ever; 0 = no cap. Each rerun "
           "draws new samples, but a prompt on which the policy rambles to max_new_tokens in most samples is "
           "slow at any seed, so reruns are dropped far more often than first attempts (BENCHMARKS.md P7).",
        min=0)
    checkpoint_every: int = doc(0, "Save a checkpoint every N steps (0 = only at the end).", min=0)
    resume: bool = doc(False, "Continue from the newest complete checkpoint in output_dir (exactly once: kept "
                              "groups are trained, prompts in flight run again, logs rewound to its step).")
    replay: str | None = doc(None, "Train on the batches another run recorded (its run dir, logged with "
                                   "logging.trajectories_per_step=-1) instead of generating: step N trains that "
                                   "run's step-N groups. Reproduces its updates bitwise; the engine only serves eval.")


@dataclass
class EvalConfig:
    num_tasks: int = doc(500, "Held-out tasks per evaluation (0 = no evaluation); 500 gives a standard error of ~2 points.", min=0)
    every: int = doc(40, "Evaluate every N steps (and always before the first and after the last).", min=0)
    temperature: float = doc(1.0, "Sampling temperature for evaluation (0 = greedy).", min=0.0)
    env_kwargs: dict = doc({"split": "eval"}, "Env kwargs overriding env.kwargs for evaluation (held-out split).")


@dataclass
class LoggingConfig:
    tensorboard: bool = doc(True, "Write TensorBoard event files under output_dir/tensorboard.")
    wandb_project: str | None = doc(None, "Log to this Weights & Biases project (needs `pip install wandb`).")
    trajectories_per_step: int = doc(32, "Trajectories saved per training step to output_dir/trajectories/ with "
                                         "their per-token advantages (for `agentrl report`); -1 all, 0 none.", min=-1)


@dataclass
class RunConfig:
    output_dir: str = doc("runs/latest", "Where trajectories, metrics and the resolved config are written.")
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    distributed: Literal["local", "ray"] = doc(
        "local", "Orchestration: 'local' runs engine, episodes and trainer in this process; 'ray' runs them as "
        "Ray actors on placement groups (see ray.*; pip install 'agentrl[ray]').")
    ray: RayConfig = field(default_factory=RayConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


# ------------------------------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{path}: {value!r} is not one of {list(get_args(tp))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, path)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{path}: bad value {value!r}")
    if is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return _build(tp, value, path)
    base = origin or tp
    if base is float and not isinstance(value, bool) and isinstance(value, (int, float, str)):
        return _finite(value, path)
    if base is bool and not isinstance(value, bool):
        raise ConfigError(f"{path}: expected true/false, got {value!r}")
    if base in (int, float, str, dict, list) and not isinstance(value, base) or (base is int and isinstance(value, bool)):
        raise ConfigError(f"{path}: expected {_type_name(base)}, got {value!r} ({type(value).__name__})")
    if base is int and not -2**63 <= value < 2**63:  # numpy seeds, torch sizes and rlimits stop at 64 bits
        raise ConfigError(f"{path}: {value} is too large (more than 64 bits)")
    return value


def _finite(value: int | float | str, path: str) -> float:
    """A float field's value: ints and YAML 1.1's unquoted "1e-4" (a string) accepted; NaN and
    infinities rejected, as every float of the tree (rates, temperatures, timeouts) must be finite."""
    try:
        out = float(value)
    except ValueError:
        raise ConfigError(f"{path}: expected float, got {value!r} (str)") from None
    except OverflowError:  # an int beyond float range
        raise ConfigError(f"{path}: a {len(str(value))}-digit number is out of float range (must be finite)") from None
    reason = finite_error(out)
    if reason:
        shown = repr(value) if len(str(value)) < 40 else f"a {len(str(value))}-character number"
        raise ConfigError(f"{path}: {shown} is not a finite number")
    return out


def _build(cls: type, data: dict, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = prefix or "config"
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(names)}")
    kwargs = {}
    for name, value in data.items():
        path = f"{prefix}.{name}" if prefix else name
        f = names[name]
        v = _coerce(value, hints[name], path)
        lo, hi = f.metadata.get("min"), f.metadata.get("max")
        if lo is not None and isinstance(v, (int, float)) and v < lo:
            raise ConfigError(f"{path}: {v!r} is below the minimum {lo}")
        if hi is not None and isinstance(v, (int, float)) and v > hi:
            raise ConfigError(f"{path}: {v!r} is above the maximum {hi}")
        kwargs[name] = v
    return cls(**kwargs)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "kwargs" else v
    return out


def parse_override(item: str) -> dict:
    """``a.b=c`` -> {"a": {"b": c}} with c parsed as YAML (so 3 is an int, [1,2] a list)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. rollout.group_size=8")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {key!r}: empty field name in the key (expected e.g. rollout.group_size)")
    try:
        value = parse_text(raw, yaml.safe_load) if raw != "" else ""
    except BadText as e:
        raise ConfigError(f"--set {key}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {_short(item)!r}: cannot parse value: {_one_line(e)}") from None
    out: dict = {}
    cur = out
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} chars)"


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


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


def load_config(files: list[str | Path] = (), overrides: list[str] = (), base: dict | None = None) -> RunConfig:
    """Merge defaults <- ``base`` <- YAML files (in order) <- ``--set`` overrides, then validate."""
    data: dict = dict(base or {})
    for f in files:
        data = _deep_merge(data, _read_file(Path(f)))
    for o in overrides:
        data = _deep_merge(data, parse_override(o))
    cfg = _build(RunConfig, data)
    cfg.trainer.check()
    return cfg


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
