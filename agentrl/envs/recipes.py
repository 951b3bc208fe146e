"""Run recipes: the config layer an env brings to every job that names it.

A recipe is a config mapping (the shape of a YAML config file) registered with the env
(``register(..., run_defaults=...)``; the built-ins' below). ``agentrl.config.schema.load_config``
lays it under the user's own layers whenever the merged ``env.id`` is that env, so
``agentrl run --env textworld`` trains with the settings TextWorld needs (its warm-started model, 30
turns, a per-turn discount) while anything the user sets (``-c``, ``--set``, a command's options) still
wins. ``agentrl config --set env.id=ID`` prints the result. An env without a recipe runs on the
embedded defaults, which are tuned for ``code_exec``.

Owns the built-in envs' recipes. Pure data: importing it imports no env code.
"""

from __future__ import annotations

#: ``TextWorld-v0`` (alias ``textworld``): the long-horizon household env of issue 15 (GiGPO).
TEXTWORLD: dict = {
    "model": {"path": "builtin:textworld"},  # the built-in tiny model warm-started on TextWorld play
    "env": {"kwargs": {"difficulty": 1}},  # "put a mug in cabinet 2": fetch and place, no treatment
    "rollout": {
        "group_size": 4,
        "max_turns": 30,  # one action per turn; the explorer needs 9-31 at difficulty 1 (17 median)
        "max_new_tokens": 48,  # one tool call is ~25 tokens
        "max_context": 4096,  # ~1,000 tokens of tool schemas + 30 turns of call and observation
        "temperature": 1.0,
    },
    "algo": {"gamma": 0.95},  # per-turn discount of the step returns (gigpo, turn_return, turn_gae)
    "train": {"steps": 40, "groups_per_step": 4, "max_staleness": 0, "checkpoint_every": 0},
    "eval": {"num_tasks": 64, "every": 20},
    # 1e-4 (BENCHMARKS.md, issue 15): with token-mean aggregation 1e-3 wrecked the warm start within 3 steps
    # and 3e-4 within 8 (it learnt to end its episodes without a call); 1e-4 with the grpo preset's
    # seq-mean-token-mean did no harm in 30 steps (held-out 6-11 of 64 after, 4 before, in 4 of 4 runs)
    "trainer": {"lr": 1.0e-4, "lr_schedule": "constant"},
}
