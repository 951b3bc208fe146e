"""The TextWorld env (``TextWorld-v0``, alias ``textworld``): a procedurally generated house,
household goals, typed action tools, reward only at the end, ``state_key()`` for GiGPO.

Modules: ``world`` (state and rules), ``gen`` (procedural worlds, train/eval split), ``oracle``
(the planner), ``env`` (``TextWorldEnv``, the tool-calling env).
"""

from agentrl.envs.textworld.env import TextWorldEnv, hermes_call
from agentrl.envs.textworld.gen import generate_world
from agentrl.envs.textworld.oracle import oracle_actions
from agentrl.envs.textworld.world import World

__all__ = ["TextWorldEnv", "World", "generate_world", "hermes_call", "oracle_actions"]
