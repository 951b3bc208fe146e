"""skyrl-gym text envs as agentrl envs: ``SkyRLGymEnv`` wraps any env of the ``skyrl_gym`` package
(a ``BaseTextEnv``: ``init(prompt) -> (prompt, metadata)``, ``step(action) -> {observations, reward,
done, metadata, postprocessed_action}``) in the :class:`agentrl.envs.base.AgentEnv` contract.

Ids (registered by ``agentrl.envs.builtin``): ``skyrl/<id>`` for skyrl-gym's own envs (``gsm8k``,
``gsm8k_multi_turn``, ``aime``, ``lcb``, ``text2sql``, ``search``, ``searchcode``) and ``skyrl``,
which takes ``env_id=`` (any id in skyrl-gym's registry, ``"module:Name"`` included) or, without
one, the ``env_class`` of each dataset row.

Tasks are skyrl-train's dataset rows (``prompt``: chat messages, ``env_class``, and the env's own
fields such as ``reward_spec``); as skyrl-train does, the env is made per episode with
``skyrl_gym.make(env_class, env_config=..., extras=<the row without prompt and env_class>)``.
Rows come from ``dataset`` (.jsonl/.json/.parquet, read by ``agentrl.envs.datasets.read_rows``),
or, for ``gsm8k``/``gsm8k_multi_turn`` without one, from a small built-in sample
(``agentrl.envs.adapters.skyrl_sample``). The eval split (``split="eval"``): ``eval_dataset`` when
given, else the rows of ``dataset`` whose id hashes into ``eval_fraction`` (the others are the
train split; the hash is stable, so the two never share a row), else the sample's eval rows.

A turn: ``step(text)`` hands the assistant text to the skyrl env; its ``reward`` is the step's
reward (the episode's reward is the last step's, agentrl's contract; per-step rewards reach the
turn records), ``done`` terminates, ``observations`` are the messages appended (roles ``user`` or
``tool``). The sampled tokens stay the truth: a ``postprocessed_action`` is reported in the step's
info, never swapped in. skyrl envs parse their own tool tags, so ``tool_stats`` stay zero (the
contract's keys, nothing counted). ``stop_strings`` (read by the episode manager) are the closing tags the tag
envs expect (``DEFAULT_STOPS``) unless ``stop=`` says otherwise. An exception raised by the skyrl
env is an ``EnvError`` naming it; a non-finite reward a ``RewardError``.

Does not: install skyrl-gym (``pip install 'agentrl[skyrl]'``), download datasets, or run skyrl's
tools anywhere but in this process (the wrapped env does what it does).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from typing import Any

from gymnasium.error import ResetNeeded

from agentrl.envs.adapters.skyrl_sample import SAMPLE_ENVS, SAMPLE_EVAL, SAMPLE_TRAIN
from agentrl.envs.base import AgentEnv, join_messages, new_stats
from agentrl.envs.datasets import read_rows
from agentrl.errors import ConfigError, DatasetError, EnvError, RewardError

#: stop strings of skyrl-gym's tag envs: the closing tags that end an action
DEFAULT_STOPS: dict[str, tuple[str, ...]] = {
    "search": ("</search>", "</answer>"),
    "text2sql": ("</sql>", "</solution>"),
    "searchcode": ("</tool>", "</solution>"),
}
SPLITS = ("train", "eval")
_OBS_ROLES = ("user", "tool")
_CACHE: dict[tuple, list[dict]] = {}


def import_skyrl() -> Any:
    """The ``skyrl_gym`` module, or a ConfigError saying how to install it."""
    try:
        import skyrl_gym
    except ImportError as e:
        raise ConfigError(f"skyrl-gym envs need the skyrl-gym package: pip install 'agentrl[skyrl]' ({e})") from e
    return skyrl_gym


def row_task(row: dict, label: str, default_id: str, env_id: str | None) -> dict:
    """A raw skyrl row -> ``{id, env_class, data_source, row}`` (JSON-able); DatasetError naming
    ``label`` when it has no usable prompt or env class, or names another env than ``env_id``."""
    row = json.loads(json.dumps(row, default=str))  # detached from pyarrow / numpy, JSON-able
    prompt = row.get("prompt")
    if isinstance(prompt, str) and prompt.strip():
        row["prompt"] = prompt = [{"role": "user", "content": prompt}]
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        )
    ):
        raise DatasetError(f"{label}: 'prompt' must be a string or a non-empty list of chat messages")
    env_class = row.get("env_class")
    if env_id is not None and env_class not in (None, env_id):
        raise DatasetError(f"{label}: the row's env_class is {env_class!r}, but this env runs {env_id!r}")
    env_class = env_id or env_class
    if not isinstance(env_class, str) or not env_class:
        raise DatasetError(f"{label}: no env_class (give the env an env_id, or each row an env_class)")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    rid = row.get("id", extra.get("index"))
    stem = default_id.rsplit("-", 1)[0]
    return {
        "id": f"{stem}-{rid}" if rid is not None else default_id,
        "env_class": env_class,
        "data_source": str(row.get("data_source") or stem),
        "row": row,
    }


def file_tasks(path: str | os.PathLike, env_id: str | None) -> list[dict]:
    """The tasks of a dataset file (cached by path, mtime and size: envs are made per episode)."""
    p = os.path.abspath(os.path.expanduser(str(path)))
    try:
        st = os.stat(p)
    except OSError as e:
        raise DatasetError(f"{p}: cannot open dataset: {e.strerror or e}") from e
    key = (p, st.st_mtime_ns, st.st_size, env_id)
    if key not in _CACHE:
        stem = os.path.splitext(os.path.basename(p))[0]
        tasks = [row_task(row, f"{p}: {label}", f"{stem}-{i}", env_id) for i, (label, row) in enumerate(read_rows(p))]
        if not tasks:
            raise DatasetError(f"{p}: no rows")
        if len(_CACHE) >= 8:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = tasks
    return _CACHE[key]


def in_eval(task_id: str, eval_fraction: float) -> bool:
    """Whether a row with this id is held out (a stable hash: the same answer in every process)."""
    h = int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "big")
    return h / 2**64 < eval_fraction


def select_tasks(env_id: str | None, dataset: Any, eval_dataset: Any, split: str, eval_fraction: float) -> list[dict]:
    """The tasks of ``split`` (the rule in the module docstring); ConfigError when there are none."""
    if dataset is None:
        if env_id not in SAMPLE_ENVS:
            raise ConfigError(
                f"skyrl env {env_id!r} needs dataset= (a .jsonl/.parquet of skyrl rows); the built-in "
                f"sample only suits {list(SAMPLE_ENVS)}"
            )
        rows = SAMPLE_EVAL if split == "eval" else SAMPLE_TRAIN
        return [
            row_task({**r, "env_class": env_id}, f"sample row {i}", f"sample_{split}-{i}", env_id)
            for i, r in enumerate(rows)
        ]
    if split == "eval" and eval_dataset is not None:
        return file_tasks(eval_dataset, env_id)
    tasks = file_tasks(dataset, env_id)
    if eval_dataset is not None:
        return tasks
    out = [t for t in tasks if in_eval(t["id"], eval_fraction) == (split == "eval")]
    if not out:
        raise ConfigError(
            f"skyrl env: the {split} split of {dataset} is empty (eval_fraction={eval_fraction} of "
            f"{len(tasks)} rows); give eval_dataset= or change eval_fraction"
        )
    return out


def check_messages(value: Any, where: str, roles: tuple[str, ...] | None) -> list[dict]:
    """``value`` as chat messages (role and content strings); EnvError naming ``where`` otherwise."""
    if not isinstance(value, list):
        raise EnvError(f"{where} returned {type(value).__name__}, not a list of chat messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise EnvError(f"{where}: message {i} is not a {{'role': str, 'content': str}} object: {m!r:.200}")
        if roles is not None and m["role"] not in roles:
            raise EnvError(f"{where}: message {i} has role {m['role']!r}; observations must be one of {roles}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


class SkyRLGymEnv(AgentEnv):
    """A skyrl-gym env behind the AgentEnv contract; see the module docstring."""

    has_eval_split = True

    def __init__(
        self,
        env_id: str | None = None,
        *,
        dataset: str | None = None,
        eval_dataset: str | None = None,
        split: str = "train",
        eval_fraction: float = 0.1,
        env_config: dict | None = None,
        stop: list[str] | tuple[str, ...] | None = None,
        max_text_length: int = 1 << 20,
    ) -> None:
        super().__init__(max_text_length=max_text_length)
        if split not in SPLITS:
            raise ConfigError(f"skyrl env split must be one of {SPLITS}, got {split!r}")
        if not 0 < eval_fraction < 1:
            raise ConfigError(f"skyrl env eval_fraction must be in (0, 1), got {eval_fraction!r}")
        if env_config is not None and not isinstance(env_config, dict):
            raise ConfigError(f"skyrl env env_config must be a mapping, got {env_config!r:.200}")
        if isinstance(stop, str) or (stop is not None and not all(isinstance(s, str) and s for s in stop)):
            raise ConfigError(f"skyrl env stop must be a list of non-empty strings, got {stop!r}")
        self._skyrl = import_skyrl()
        if env_id is not None:
            self._check_id(env_id)
        self.env_id, self.split = env_id, split
        self.tasks = select_tasks(env_id, dataset, eval_dataset, split, eval_fraction)
        for env_class in sorted({t["env_class"] for t in self.tasks} - {env_id}):
            self._check_id(env_class)
        from omegaconf import OmegaConf  # skyrl-gym's envs read their config as attributes (a DictConfig)

        self._config = OmegaConf.create(env_config or {})
        self.stop_strings: tuple[str, ...] = tuple(stop) if stop is not None else DEFAULT_STOPS.get(env_id or "", ())
        self._inner: Any = None
        self._done = True

    def _check_id(self, env_class: str) -> None:
        try:
            self._skyrl.spec(env_class)
        except Exception as e:
            known = ", ".join(sorted(self._skyrl.registry)) or "(none)"
            raise ConfigError(
                f"skyrl-gym has no env {env_class!r} ({type(e).__name__}: {e}); registered: {known}"
            ) from e

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        task = options["task"] if "task" in options else self.tasks[int(self.np_random.integers(len(self.tasks)))]
        if not isinstance(task, dict) or not isinstance(task.get("row"), dict) or "env_class" not in task:
            raise EnvError(f"skyrl env: a task must be a dict with 'env_class' and 'row', got {task!r:.200}")
        self._close_inner()
        row, env_class = task["row"], task["env_class"]
        extras = copy.deepcopy({k: v for k, v in row.items() if k not in ("prompt", "env_class")})
        where = f"skyrl-gym env {env_class!r} (task {task.get('id')!r})"
        try:
            self._inner = self._skyrl.make(env_class, env_config=self._config, extras=extras)
            prompt, meta = self._inner.init(copy.deepcopy(row["prompt"]))
        except Exception as e:
            raise EnvError(f"{where} failed to start: {type(e).__name__}: {e}") from e
        messages = check_messages(prompt, f"{where}.init", None)
        self._done = False
        info = {"messages": messages, "tools": [], "task": copy.deepcopy(task), "skyrl_metadata": meta or {}}
        return join_messages(messages), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._done or self._inner is None:
            raise ResetNeeded("step() after the episode ended (or before reset()); call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"action must be the assistant turn's text (str), got {type(action).__name__}")
        where = f"skyrl-gym env {type(self._inner).__name__}"
        try:
            out = self._inner.step(action)
        except Exception as e:
            raise EnvError(f"{where}.step raised {type(e).__name__}: {e}") from e
        if not isinstance(out, dict) or not {"observations", "reward", "done"} <= out.keys():
            raise EnvError(f"{where}.step returned {out!r:.200}, not observations/reward/done")
        try:
            reward = float(out["reward"])
        except (TypeError, ValueError):
            raise RewardError(f"{where}.step returned reward {out['reward']!r}, not a number") from None
        if not math.isfinite(reward):
            raise RewardError(f"{where}.step returned reward {reward}")
        done = bool(out["done"])
        messages = [] if done else check_messages(out["observations"] or [], f"{where}.step", _OBS_ROLES)
        info: dict[str, Any] = {
            "messages": messages,
            "tool_stats": new_stats(),
            "skyrl_metadata": out.get("metadata") or {},
        }
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = out["postprocessed_action"]
        if done:
            self._done = True
            info["skyrl_metrics"] = self._inner.get_metrics() if hasattr(self._inner, "get_metrics") else {}
        return join_messages(messages), reward, done, False, info

    def _close_inner(self) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            try:
                inner.close()
            except Exception:
                pass  # a failing close of a finished episode's env must not fail the next episode

    def close(self) -> None:
        self._close_inner()
        self._done = True
        super().close()
