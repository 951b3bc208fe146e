"""agentrl: reinforcement learning for multi-turn, tool-calling LLM agents.

The public surface for env, tool and agent authors is re-exported here and pinned by a test
(``tests/test_public_api.py``); everything else is importable from its own module but may move.
Names load on first use, so ``import agentrl`` (and importing any submodule) stays cheap: torch and
transformers load only when an engine or model is built.
"""

import importlib

__version__ = "0.1.0"

#: public name -> the module that defines it
_PUBLIC = {
    "AgentEnv": "agentrl.envs.base",
    "TextSpace": "agentrl.envs.base",
    "ToolEnv": "agentrl.envs.base",
    "check_agent_env": "agentrl.envs.checker",
    "assert_agent_env": "agentrl.envs.checker",
    "make": "agentrl.envs.registry",
    "register": "agentrl.envs.registry",
    "registered": "agentrl.envs.registry",
    "spec": "agentrl.envs.registry",
    "Tool": "agentrl.tools.base",
    "ToolSet": "agentrl.tools.base",
    "tool": "agentrl.tools.base",
    "Trajectory": "agentrl.trajectory",
    "Outcome": "agentrl.trajectory",
    "TurnRecord": "agentrl.trajectory",
    "Engine": "agentrl.engine.base",
    "Generation": "agentrl.engine.base",
    "SamplingParams": "agentrl.engine.base",
    "AgentRLError": "agentrl.errors",
    "ConfigError": "agentrl.errors",
}


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


__all__ = sorted([*_PUBLIC, "__version__"])
