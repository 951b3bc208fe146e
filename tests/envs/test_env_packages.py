"""The env packages under ``envs/`` at the repository root: each is a distribution of its own whose
pyproject registers its envs through the ``agentrl.envs`` entry-point group, found by agentrl in a fresh
interpreter by that alone (installed as ``tests/dist_info.py`` lays it out), conformant to the env
contract (``agentrl.envs.checker``), and solvable: its own reference solution scores 1.0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import components
import pytest

pytest.importorskip("tomllib", reason=components.reason("py311", "tomllib needs Python 3.11+"))

from dist_info import install_as_dist_info  # noqa: E402

ENVS = Path(__file__).resolve().parents[2] / "envs"
PACKAGES = sorted(p.parent for p in ENVS.glob("*/pyproject.toml"))

_CHECK = """
import sys
from agentrl.envs import registry
from agentrl.envs.checker import assert_agent_env
for env_id in sys.argv[1:]:
    assert env_id in registry.registered(), (env_id, "not found through its entry point")
    env = registry.make(env_id)
    assert_agent_env(env)
    _, info = env.reset(seed=3)
    solution = info["task"].get("solution")
    if solution is not None:
        assert env.step(solution)[1] == 1.0, (env_id, info["task"])
    env.close()
    print("ok", env_id)
"""


def test_envs_holds_env_packages():
    assert PACKAGES, "envs/ has no package (a pyproject.toml per package)"


@pytest.mark.parametrize("pkg", PACKAGES, ids=[p.name for p in PACKAGES])
def test_env_package_registers_through_its_entry_point(pkg, tmp_path):
    meta = install_as_dist_info(pkg, tmp_path)
    ids = sorted(meta["entry-points"]["agentrl.envs"])
    assert ids and "agentrl" in meta["dependencies"], meta
    path = os.pathsep.join([str(tmp_path), str(pkg), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, *ids],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.split() == [w for i in ids for w in ("ok", i)], done.stdout
