"""The public surface env, tool and agent authors import is pinned: names move only on purpose.

The inside of the package may be reorganised freely; what ``agentrl`` re-exports (and the old module
paths README users may have typed, forwarded for one release) may not change without changing this test.
"""

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


@pytest.mark.parametrize(
    "old,new,name",
    [
        ("agentrl.tooling", "agentrl.tools.base", "tool"),
        ("agentrl.env_checker", "agentrl.envs.checker", "check_agent_env"),
        ("agentrl.registry", "agentrl.envs.registry", "register"),
        ("agentrl.judge", "agentrl.envs.judge", "JudgeReward"),
    ],
)
def test_old_documented_paths_forward_with_a_warning(old, new, name):
    code = (
        f"import warnings; warnings.simplefilter('error')\n"
        f"try:\n    import {old}\nexcept DeprecationWarning as e:\n    print('warned', e)\n"
        f"warnings.simplefilter('ignore')\nimport importlib, {new}\n"
        f"m = importlib.import_module('{old}')\nprint(m is {new}, hasattr(m, '{name}'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert f"warned {old} moved to {new}" in out
    assert out.strip().endswith("True True")


def test_version_matches_the_distribution():
    from importlib.metadata import version

    with warnings.catch_warnings():
        assert agentrl.__version__ == version("agentrl")
