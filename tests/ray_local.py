"""A local Ray instance in the tests: what the ``distributed: ray`` tests (tests/distributed) and the
drained-updates run over Ray (tests/jobs/test_partial_rollouts_live.py) share.

Owns ``CountEnv`` (registered as ``test/RayCount-v0`` on import, from this module rather than an
installed one, so a rollout worker can only build it if the driver's env spec reaches it),
``RUN_ARGS`` (the rollout settings of those runs), ``ray_run_cfg`` (a shortened ``agentrl run``
with ``distributed=MODE``), ``ray_or_skip`` (skip, saying why, where Ray is not installed) and
``ray_pids`` / ``assert_no_leak`` (no Ray process outlives a test).
"""

from __future__ import annotations

import subprocess
import time

import components

import agentrl
from agentrl.config.schema import load_config
from agentrl.envs.base import AgentEnv, join_messages, new_stats


class CountEnv(AgentEnv):
    """One turn; reward = 1 - chars/40, as tests/short_run.py's ShortEnv. A copy, not a subclass: the
    whole class travels to the Ray workers by value, and a base class from short_run would travel by
    reference to workers that cannot import tests/."""

    has_eval_split = False  # no held-out tasks: eval runs on the same kind of prompts

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        msgs = [{"role": "user", "content": f"Say a number ({self.np_random.integers(100)})."}]
        return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": seed}}

    def step(self, action):
        return "", 1.0 - min(len(action), 40) / 40, True, False, {"messages": [], "tool_stats": new_stats()}


agentrl.register("test/RayCount-v0", entry_point=CountEnv, override=True)

RUN_ARGS = [
    "env.id=test/RayCount-v0",
    "env.kwargs={}",
    "rollout.max_new_tokens=6",
    "rollout.max_turns=1",
    "rollout.score_truncated=true",
    "rollout.group_size=4",
    "rollout.temperature=1.0",
]


def ray_run_cfg(model_dir, out, mode: str, steps: int = 3):
    """A ``steps``-step run on ``test/RayCount-v0`` with ``distributed=mode`` (2 CPUs, split placement)."""
    return load_config(
        [],
        [
            f"output_dir={out}",
            f"model.path={model_dir}",
            *RUN_ARGS,
            "train.groups_per_step=2",
            f"train.steps={steps}",
            "train.max_staleness=0",
            "train.checkpoint_every=2",
            "eval.num_tasks=4",
            "eval.every=0",
            "eval.env_kwargs={}",
            "trainer.lr=2e-2",
            "trainer.loss_agg=token-mean",
            "logging.tensorboard=false",
            f"distributed={mode}",
            "ray.num_cpus=2",
            "ray.placement=split",
            "ray.workers_per_engine=2",
        ],
    )


def ray_or_skip():
    """The ``ray`` module, or skip the test saying why it is missing."""
    try:
        import ray
    except ImportError as e:
        components.unavailable("ray", f"Ray is not installed ({e}); pip install 'agentrl[ray]'")
    return ray


def ray_pids() -> set[int]:
    """Pids of the Ray processes running now (raylet, GCS, workers)."""
    out = subprocess.run(["pgrep", "-f", "raylet|gcs_server|ray::|default_worker.py"], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


#: how long Ray's processes may take to exit after a shutdown: a hang guard, not a timing. On an idle 2-core
#: machine a local instance's ~7 processes are gone in seconds; with the suite's other worker busy (SGLang, a
#: training run) they took over 30 s, and a simulated 3-node cluster's over 60 s
LEAK_WAIT_S = 180.0


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "(gone)"


def assert_no_leak(before: set[int], timeout_s: float = LEAK_WAIT_S) -> None:
    """Fail unless every Ray process not in ``before`` is gone within ``timeout_s`` (naming what is left)."""
    deadline = time.monotonic() + timeout_s
    while (left := ray_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "Ray processes left running: " + "; ".join(f"{p}: {_cmdline(p)}" for p in sorted(left))
