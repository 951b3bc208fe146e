"""Env registry: built-ins, register/make/spec, lazy entry points, and third-party discovery."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import components
import gymnasium
import pytest
from dist_info import install_as_dist_info

from agentrl.envs import registry
from agentrl.envs.base import AgentEnv
from agentrl.envs.checker import assert_agent_env
from agentrl.errors import ConfigError, RegistryError

tomllib = pytest.importorskip("tomllib", reason=components.reason("py311", "tomllib needs Python 3.11+"))

THIRDPARTY = Path(__file__).resolve().parents[1] / "thirdparty_pkg"


def test_builtins_and_aliases():
    ids = registry.registered()
    assert {"code_exec", "CodeExec-v0", "noop", "Noop-v0"} <= set(ids)
    assert ids["code_exec"].entry_point == ids["CodeExec-v0"].entry_point == "agentrl.envs.code_exec:CodeExecEnv"
    assert registry.spec("code_exec").source == "builtin" and registry.spec("code_exec").max_turns == 8
    env = registry.make("code_exec")
    assert isinstance(env, AgentEnv) and type(env).__name__ == "CodeExecEnv"
    assert type(registry.make("agentrl/Noop-v0")).__name__ == "NoopEnv"  # Gymnasium-style id works too


def test_builtins_in_gymnasium_registry():
    for gid in ("agentrl/CodeExec-v0", "agentrl/Noop-v0"):
        assert gid in gymnasium.registry
    env = gymnasium.make("agentrl/Noop-v0", n_turns=2)
    assert env.unwrapped.n_turns == 2


def test_make_kwargs_override_defaults(clean_registry):
    registry.register("test/Noop3-v0", "agentrl.envs.noop:NoopEnv", n_turns=3, reward=0.5)
    env = registry.make("test/Noop3-v0")
    assert (env.n_turns, env.reward) == (3, 0.5)
    assert registry.make("test/Noop3-v0", n_turns=5).n_turns == 5
    assert registry.spec("test/Noop3-v0").make().n_turns == 3


def test_unknown_id_lists_close_matches():
    with pytest.raises(RegistryError, match=r"unknown env id 'code_exe'; did you mean 'code_exec'"):
        registry.make("code_exe")
    with pytest.raises(RegistryError, match="registered: .*noop"):
        registry.spec("zzzzzzzzzzzz")


def test_bad_kwargs_are_config_errors():
    with pytest.raises(ConfigError, match="code_exec.*no_such_option"):
        registry.make("code_exec", no_such_option=1)


def test_duplicates_and_override(clean_registry):
    registry.register("test/A-v0", "agentrl.envs.noop:NoopEnv", n_turns=2)
    registry.register("test/A-v0", "agentrl.envs.noop:NoopEnv", n_turns=2)  # identical: a no-op
    with pytest.raises(RegistryError, match="already registered"):
        registry.register("test/A-v0", "agentrl.envs.noop:NoopEnv", n_turns=4)
    registry.register("test/A-v0", "agentrl.envs.noop:NoopEnv", n_turns=4, override=True)
    assert registry.make("test/A-v0").n_turns == 4


@pytest.mark.parametrize("bad", ["no_colon", ":Cls", "mod:", 42])
def test_bad_entry_point_shapes(clean_registry, bad):
    with pytest.raises(RegistryError):
        registry.register("test/Bad-v0", bad)


def test_bad_ids_and_max_turns(clean_registry):
    for bad_id in ("", "has space"):
        with pytest.raises(RegistryError):
            registry.register(bad_id, "m:C")
    with pytest.raises(RegistryError):
        registry.register("test/T-v0", "m:C", max_turns=0)


def test_lazy_entry_point_import_errors_name_the_entry_point(clean_registry):
    registry.register("test/Missing-v0", "agentrl_no_such_module.envs:Env")  # registering imports nothing
    with pytest.raises(
        RegistryError, match=r"test/Missing-v0.*'agentrl_no_such_module\.envs:Env'.*ModuleNotFoundError"
    ):
        registry.make("test/Missing-v0")
    registry.register("test/NoAttr-v0", "agentrl.envs.noop:NoSuchClass")
    with pytest.raises(RegistryError, match="AttributeError"):
        registry.make("test/NoAttr-v0")


def test_callable_entry_point_and_non_env_result(clean_registry):
    from agentrl.envs.noop import NoopEnv

    registry.register("test/Fn-v0", lambda **kw: NoopEnv(n_turns=7, **kw), max_turns=3)
    assert registry.make("test/Fn-v0").n_turns == 7 and registry.spec("test/Fn-v0").max_turns == 3
    registry.register("test/NotEnv-v0", lambda: object())
    with pytest.raises(RegistryError, match="not a gymnasium.Env"):
        registry.make("test/NotEnv-v0")


def test_importing_registry_is_cheap():
    code = (
        "import sys, agentrl.envs.registry as r; r.registered(); "
        "heavy = ('torch', 'transformers', 'agentrl.envs.code_exec', 'agentrl.tools.base'); "
        "bad = [m for m in heavy if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ third-party entry points
def _install_as_dist_info(site: Path) -> None:
    """What `pip install tests/thirdparty_pkg` would leave behind, minus pip (``tests/dist_info.py``)."""
    install_as_dist_info(THIRDPARTY, site)


def test_third_party_env_found_through_entry_point(tmp_path, monkeypatch, clean_registry):
    _install_as_dist_info(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(THIRDPARTY))
    # The package is not imported by discovery: only by make().
    monkeypatch.delitem(sys.modules, "agentrl_thirdparty.echo", raising=False)
    s = registry.spec("thirdparty/Echo-v0")  # a miss triggers a rescan of the entry-point group
    assert s.entry_point == "agentrl_thirdparty.echo:EchoEnv"
    assert s.source == "entry point of agentrl-thirdparty-example"
    assert "agentrl_thirdparty.echo" not in sys.modules
    env = registry.make("thirdparty/Echo-v0")
    _, info = env.reset(seed=0)
    word = info["task"]["answer"]
    assert env.step(word)[1] == 1.0
    assert_agent_env(env)
    env.close()
    assert "thirdparty/Echo-v0" in registry.registered()


def test_explicit_registration_shadows_entry_point(tmp_path, monkeypatch, clean_registry):
    _install_as_dist_info(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.register("thirdparty/Echo-v0", "agentrl.envs.noop:NoopEnv", override=True)
    with pytest.warns(UserWarning, match="shadowed"):
        registry._discover()
    assert registry.spec("thirdparty/Echo-v0").entry_point == "agentrl.envs.noop:NoopEnv"


# ------------------------------------------------------------------ Gymnasium mirror
def test_every_registration_is_mirrored_into_gymnasium(clean_registry):
    import agentrl
    from agentrl.envs.noop import NoopEnv

    agentrl.register("my_org/MyEnv-v0", NoopEnv, n_turns=3)
    env = gymnasium.make("my_org/MyEnv-v0", n_turns=2)  # kwargs reach agentrl.make, over the registered ones
    assert isinstance(env.unwrapped, NoopEnv) and env.unwrapped.n_turns == 2
    assert gymnasium.make("my_org/MyEnv-v0").unwrapped.n_turns == 3
    agentrl.register("my_org/MyEnv-v0", NoopEnv, n_turns=5, override=True)
    assert gymnasium.make("my_org/MyEnv-v0").unwrapped.n_turns == 5  # the mirror follows the override
    assert "agentrl/CodeExec-v0" in gymnasium.registry and "code_exec" not in gymnasium.registry  # aliases stay ours
    with pytest.warns(UserWarning, match="not mirrored into Gymnasium: Gymnasium already has 'CartPole-v1'"):
        agentrl.register("CartPole-v1", NoopEnv)
    assert "cartpole" in str(gymnasium.registry["CartPole-v1"].entry_point)  # Gymnasium's own env is untouched


def test_third_party_id_works_in_gymnasium_make_after_importing_agentrl_envs(tmp_path):
    """A fresh interpreter with the package installed (its dist-info on the path): `import
    agentrl.envs` reads the entry points and mirrors them, so `gymnasium.make` finds the id."""
    import os

    _install_as_dist_info(tmp_path)
    code = """
import gymnasium
try:
    gymnasium.make("thirdparty/Echo-v0")
    raise SystemExit("visible before agentrl.envs was imported?")
except gymnasium.error.NamespaceNotFound:
    pass
import agentrl.envs
env = gymnasium.make("thirdparty/Echo-v0")
_, info = env.reset(seed=0)
held = gymnasium.make("thirdparty/Echo-v0", split="eval")
_, held_info = held.reset(seed=0)
assert type(env.unwrapped).__name__ == "EchoEnv", type(env.unwrapped)
assert info["task"]["answer"] != held_info["task"]["answer"], (info["task"], held_info["task"])
print("ok", info["task"]["id"], held_info["task"]["id"])
"""
    path = os.pathsep.join([str(tmp_path), str(THIRDPARTY), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.startswith("ok echo-"), done.stdout + done.stderr
