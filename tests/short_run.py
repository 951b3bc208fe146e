"""The short training run the end-to-end tests share: ``ShortEnv`` (registered as ``test/Short-v0``
on import) and ``short_run_cfg``, the config of a few-step ``agentrl run`` on it with a tiny model.
Used by tests/jobs (the loop's own tests), tests/trainer (LoRA end to end), tests/envs (the judge)
and tests/sandbox (the secrets canary)."""

import agentrl
from agentrl.config.schema import load_config
from agentrl.envs.base import AgentEnv, join_messages, new_stats


class ShortEnv(AgentEnv):
    """One turn of a fixed number of tokens; reward = 1 - chars/40: shorter tokens score higher. Any
    byte-level BPE vocabulary mixes one-character and long merged tokens, so a random tiny model has
    reward variance from step 0 and room to improve: the reward must rise if the loop really learns."""

    has_eval_split = False  # no held-out tasks: eval runs on the same kind of prompts

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        msgs = [{"role": "user", "content": f"Say a number ({self.np_random.integers(100)})."}]
        return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": seed}}

    def step(self, action):
        reward = 1.0 - min(len(action), 40) / 40
        return "", reward, True, False, {"messages": [], "tool_stats": new_stats()}


agentrl.register("test/Short-v0", entry_point=ShortEnv, override=True)


def short_run_cfg(model_dir, out, steps, extra=()):
    """A ``steps``-step run on ``test/Short-v0`` writing to ``out``; ``extra``: more ``a.b=c`` settings."""
    return load_config(
        [],
        [
            f"output_dir={out}",
            f"model.path={model_dir}",
            "env.id=test/Short-v0",
            "env.kwargs={}",
            "rollout.max_new_tokens=6",
            "rollout.max_turns=1",
            "rollout.score_truncated=true",
            "rollout.group_size=8",
            "rollout.temperature=1.0",
            "train.groups_per_step=4",
            f"train.steps={steps}",
            "train.max_staleness=0",
            "train.checkpoint_every=2",
            "eval.num_tasks=16",
            "eval.every=0",
            "eval.env_kwargs={}",
            "trainer.lr=2e-2",
            "trainer.loss_agg=token-mean",
            "logging.tensorboard=false",
            *extra,
        ],
    )
