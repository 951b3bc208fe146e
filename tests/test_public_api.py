"""The public surface env, tool and agent authors import is pinned: names move only on purpose.

The inside of the package may be reorganised freely; what ``agentrl`` re-exports may not change without
changing this test. The old top-level paths (``agentrl.tooling``, ``agentrl.env_checker``,
``agentrl.registry``, ``agentrl.judge``) forwarded for one release and are gone since 0.2.0.
"""

import importlib
import subprocess
import sys
import warnings

import pytest

import agentrl

PUBLIC = {
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


def test_public_names_are_exactly_the_pinned_ones():
    assert sorted(agentrl.__all__) == sorted([*PUBLIC, "__version__"])
    for name, module in PUBLIC.items():
        obj = getattr(agentrl, name)
        assert obj.__module__ == module, f"agentrl.{name} comes from {obj.__module__}, pinned to {module}"


def test_importing_agentrl_loads_neither_torch_nor_transformers():
    code = "import sys, agentrl; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("old", ["agentrl.tooling", "agentrl.env_checker", "agentrl.registry", "agentrl.judge"])
def test_old_top_level_paths_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_version_matches_the_distribution():
    from importlib.metadata import version

    with warnings.catch_warnings():
        assert agentrl.__version__ == version("agentrl")
