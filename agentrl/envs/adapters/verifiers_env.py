"""verifiers (PrimeIntellect's ``verifiers`` 0.4, ``verifiers.v1``) environments trained through the
recording proxy (``agent.kind: proxy``): verifiers runs its own agent loop (a harness program) and
scores with its own rewards; agentrl records every completion token-exact.

Two halves, used together (``configs/verifiers_reverse.yaml`` wires both):

- :class:`VerifiersEnv` (env id ``verifiers``): the task side. ``taskset=`` names a verifiers
  taskset (an installed taskset package's id, or any importable module exporting one Taskset
  subclass in ``__all__``) and ``taskset_args=`` its config fields. Episode ``reset(seed=s)`` picks
  row ``s mod N`` of the taskset's tasks (no seed: a random row); the held-out split
  (``split="eval"``) is the taskset built with ``eval_taskset_args`` when given (e.g. its own
  test split), else the rows whose stable key hashes into ``eval_fraction`` (the train split is
  the rest; the two never share a row). ``info["task"]`` carries what the episode callable needs
  (taskset id, args, harness, the row's index).
- :func:`run_verifiers_episode` (``agent.callable``): builds the verifiers ``Env`` for the task
  (its taskset with the harness ``harness=``, default ``null``: verifiers' plain chat loop),
  points its model client at the proxy URL with the episode's key, runs ``Env.run_episode`` on
  the row and returns ``{"reward": <the rewards' weighted sum>}`` (``agent.reward: program``).
  A verifiers episode that failed (its harness crashed, a reward raised) returns no reward and
  the error, which agentrl types as an infrastructure outcome (not trained on).

The sampling settings verifiers sends are the run's: the proxy overrides temperature, top_p and
the token limits with ``rollout.*``; the model name is read from the endpoint's ``/v1/models``.

Does not: install verifiers (``pip install 'agentrl[verifiers]'``; it pins ``mcp==2.0.0``, which
litellm's ``mcp`` extra does not accept, so install it in its own virtualenv), run harnesses in
containers (the runtime is the harness's default; verifiers' own runtime settings apply), or score
with agentrl's rewards (``step`` is not used: proxy mode with ``agent.reward: program``).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from typing import Any

from agentrl.envs.base import AgentEnv, join_messages
from agentrl.errors import ConfigError, EnvError

SPLITS = ("train", "eval")
_TASKS: dict[str, list[dict]] = {}


def import_verifiers() -> Any:
    """``verifiers.v1``, or a ConfigError saying how to install it."""
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ConfigError(
            "verifiers envs need the verifiers package (0.4): pip install 'agentrl[verifiers]' "
            f"(in its own virtualenv: it pins mcp==2.0.0, which litellm[mcp] does not accept) ({e})"
        ) from e
    return vf


def env_config(vf: Any, taskset: str, args: dict, harness: str) -> Any:
    """The verifiers env config of a taskset id + its args, played by ``harness`` in a local subprocess
    runtime (verifiers' default runtime is a remote Prime sandbox, which needs a Prime account)."""
    try:
        return vf.resolve_env_config(
            {
                "taskset": {**args, "id": taskset},
                "agent": {"harness": {"id": harness}, "runtime": {"type": "subprocess"}},
            }
        )
    except Exception as e:
        raise ConfigError(f"verifiers taskset {taskset!r} with args {args!r} is not valid: {e}") from e


def messages_of(data: Any) -> list[dict]:
    """A verifiers task's opening chat (system prompt + prompt) as plain chat messages."""
    out = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    prompt = data.prompt
    if isinstance(prompt, str):
        return [*out, {"role": "user", "content": prompt}]
    for m in prompt or []:
        m = m if isinstance(m, dict) else m.model_dump(exclude_none=True)
        content = m.get("content")
        if not isinstance(content, str):
            content = "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
        out.append({"role": m.get("role", "user"), "content": content})
    return out


def load_tasks(taskset: str, args: dict, harness: str) -> list[dict]:
    """The taskset's rows as ``{idx, key, messages}`` (cached per taskset id + args)."""
    ck = json.dumps([taskset, args, harness], sort_keys=True, default=str)
    if ck not in _TASKS:
        vf = import_verifiers()
        cfg = env_config(vf, taskset, args, harness)
        try:
            ts = vf.load_taskset(cfg.taskset)
            if not ts.bounded:
                raise ConfigError(f"verifiers taskset {taskset!r} is infinite; bound it in taskset_args")
            rows = [{"idx": t.data.idx, "key": t.key, "messages": messages_of(t.data)} for t in ts]
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError(f"verifiers taskset {taskset!r} failed to load: {type(e).__name__}: {e}") from e
        if not rows:
            raise ConfigError(f"verifiers taskset {taskset!r} with args {args!r} has no tasks")
        _TASKS[ck] = rows
    return _TASKS[ck]


def in_eval(key: str, eval_fraction: float) -> bool:
    """Whether a row with this key is held out (a stable hash: the same answer in every process)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64 < eval_fraction


class VerifiersEnv(AgentEnv):
    """A verifiers taskset's rows as agentrl episodes (see the module docstring)."""

    has_eval_split = True

    def __init__(
        self,
        taskset: str | None = None,
        *,
        taskset_args: dict | None = None,
        eval_taskset_args: dict | None = None,
        harness: str = "null",
        split: str = "train",
        eval_fraction: float = 0.2,
        max_text_length: int = 1 << 20,
    ) -> None:
        super().__init__(max_text_length=max_text_length)
        if not taskset or not isinstance(taskset, str):
            raise ConfigError(f"verifiers env needs taskset= (a verifiers taskset id or module), got {taskset!r}")
        if split not in SPLITS:
            raise ConfigError(f"verifiers env split must be one of {SPLITS}, got {split!r}")
        if not 0 < eval_fraction < 1:
            raise ConfigError(f"verifiers env eval_fraction must be in (0, 1), got {eval_fraction!r}")
        for name, value in (("taskset_args", taskset_args), ("eval_taskset_args", eval_taskset_args)):
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"verifiers env {name} must be a mapping, got {value!r:.200}")
        self.taskset, self.harness, self.split = taskset, harness, split
        if split == "eval" and eval_taskset_args is not None:
            self.args = {**(taskset_args or {}), **eval_taskset_args}
            self.rows = load_tasks(taskset, self.args, harness)
        else:
            self.args = dict(taskset_args or {})
            rows = load_tasks(taskset, self.args, harness)
            held = eval_taskset_args is None
            self.rows = [r for r in rows if not held or in_eval(r["key"], eval_fraction) == (split == "eval")]
            if not self.rows:
                raise ConfigError(
                    f"verifiers env: the {split} split of {taskset!r} is empty (eval_fraction={eval_fraction} of "
                    f"{len(rows)} rows); give eval_taskset_args= or change eval_fraction"
                )

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        if "task" in options:
            task = options["task"]
        else:
            i = seed % len(self.rows) if seed is not None else int(self.np_random.integers(len(self.rows)))
            row = self.rows[i]
            task = {
                "id": f"{self.taskset}-{row['idx']}",
                "verifiers": {"taskset": self.taskset, "args": self.args, "harness": self.harness, "idx": row["idx"]},
            }
        spec = task.get("verifiers") if isinstance(task, dict) else None
        row = next((r for r in self.rows if isinstance(spec, dict) and r["idx"] == spec.get("idx")), None)
        if row is None:
            raise EnvError(f"verifiers env: task {task!r:.200} names no row of taskset {self.taskset!r}")
        info = {"messages": row["messages"], "tools": [], "task": task}
        return join_messages(row["messages"]), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        raise ConfigError(
            "the verifiers env is scored by verifiers' own rewards in its agent loop: run it with agent.kind=proxy, "
            "agent.callable=agentrl.envs.adapters.verifiers_env:run_verifiers_episode, agent.reward=program"
        )


async def _served_model(base_url: str, api_key: str) -> str:
    import httpx

    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.get(base_url.rstrip("/") + "/models", headers={"Authorization": f"Bearer {api_key}"})
        r.raise_for_status()
        return r.json()["data"][0]["id"]


async def run_verifiers_episode(task: dict, *, base_url: str, api_key: str) -> dict:
    """One verifiers episode of ``task["task"]`` (a :class:`VerifiersEnv` task) against the proxy at
    ``base_url`` -> ``{"reward": r, "rewards": {...}}``, or ``{"error": ...}`` (no reward) when the
    verifiers episode failed."""
    spec = (task.get("task") or {}).get("verifiers")
    if not isinstance(spec, dict) or "taskset" not in spec or "idx" not in spec:
        raise ConfigError(f"run_verifiers_episode needs a task of the 'verifiers' env, got {task.get('task')!r:.200}")
    vf = import_verifiers()
    cfg = env_config(vf, spec["taskset"], spec.get("args") or {}, spec.get("harness") or "null")
    env = vf.load_environment(cfg)  # per episode: an Env holds its serving resources on itself
    row = next((t for t in env.taskset if t.data.idx == spec["idx"]), None)
    if row is None:
        raise EnvError(f"verifiers taskset {spec['taskset']!r} has no task idx {spec['idx']}")
    # verifiers reads the API key from an environment variable: a name of this episode's own
    var = "AGENTRL_VF_KEY_" + secrets.token_hex(8)
    os.environ[var] = api_key
    try:
        model = await _served_model(base_url, api_key)
        ctx = vf.ModelContext(model=model, client=vf.EvalClientConfig(base_url=base_url, api_key_var=var))
        async with env.serving():
            episode = await env.run_episode(row, ctx)
    finally:
        os.environ.pop(var, None)
    traces = list(episode.traces)
    if not episode.ok or not traces:
        errors = [f"{e.type}: {e.message}" for e in episode.errors]
        errors += [f"{e.type}: {e.message}" for t in traces for e in (getattr(t, "errors", None) or [])]
        return {"error": "; ".join(errors)[:2000] or "the verifiers episode did not finish ok"}
    rewards = {k: (r.value if r is not None else None) for t in traces for k, r in t.rewards.items()}
    return {"reward": float(sum(t.reward for t in traces)), "rewards": rewards}
