"""Built-in environments, registered on import (cheaply: entry points are strings, no env code runs).

Owns: the table of built-in envs and their registration in agentrl's registry (ids
``CodeExec-v0`` with alias ``code_exec``, ``Noop-v0`` with alias ``noop``, ``Concise-v0`` with alias
``concise``) and in Gymnasium's (``agentrl/CodeExec-v0``, ``agentrl/Noop-v0``, ``agentrl/Concise-v0``).
The env code lives in the submodules: ``base`` (AgentEnv, ToolEnv, TextSpace), ``code_exec``,
``noop``, ``concise``, ``tasks``, ``datasets``, ``rewards``.
"""
from __future__ import annotations

import gymnasium

from agentrl.envs.registry import register

#: name -> (entry point, max_turns hint, aliases)
BUILTINS: dict[str, tuple[str, int | None, tuple[str, ...]]] = {
    "CodeExec-v0": ("agentrl.envs.code_exec:CodeExecEnv", 8, ("code_exec",)),
    "Noop-v0": ("agentrl.envs.noop:NoopEnv", None, ("noop",)),
    "Concise-v0": ("agentrl.envs.concise:ConciseEnv", None, ("concise",)),
}

for _name, (_ep, _max_turns, _aliases) in BUILTINS.items():
    for _id in (_name, *_aliases):
        register(_id, _ep, max_turns=_max_turns, source="builtin")
    if f"agentrl/{_name}" not in gymnasium.registry:
        # No max_episode_steps: turn limits belong to the episode manager, not a TimeLimit wrapper.
        gymnasium.register(id=f"agentrl/{_name}", entry_point=_ep)
