"""The eval split as part of the env contract: an env takes `split`, or declares it has none
(`has_eval_split = False`: split dropped with a warning), or is a ConfigError when made with one;
`check_agent_env` reports the last case and an eval split that holds out nothing."""

from __future__ import annotations

import warnings

import pytest

from agentrl.envs import registry
from agentrl.envs.base import AgentEnv, join_messages, new_stats
from agentrl.envs.checker import check_agent_env
from agentrl.errors import ConfigError


class _OneTurn(AgentEnv):
    """Task ``n`` from the seed; any answer ends the episode with reward 1."""

    offset = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        n = int(self.np_random.integers(1000)) + self.offset
        msgs = [{"role": "user", "content": f"Say {n}."}]
        return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": f"t{n}"}}

    def step(self, action):
        return "", 1.0, True, False, {"messages": [], "tool_stats": new_stats()}


class Undeclared(_OneTurn):
    """The trap: trains fine, takes no split, says nothing about held-out tasks."""


class NoHeldOut(_OneTurn):
    has_eval_split = False


class WithSplit(_OneTurn):
    has_eval_split = True

    def __init__(self, *, split: str = "train") -> None:
        super().__init__()
        self.offset = 10_000 if split == "eval" else 0


class SplitButSameTasks(_OneTurn):
    def __init__(self, *, split: str = "train") -> None:  # accepts split, ignores it
        super().__init__()


def test_undeclared_env_made_with_split_is_a_config_error_naming_the_fix(clean_registry):
    registry.register("test/Undeclared-v0", Undeclared)
    registry.make("test/Undeclared-v0").close()  # training is fine
    with pytest.raises(ConfigError, match=r"test/Undeclared-v0.*split='eval'.*has_eval_split = False"):
        registry.make("test/Undeclared-v0", split="eval")
    with pytest.raises(ConfigError, match="has_eval_split = False"):  # at config time, no env built
        registry.check_split("test/Undeclared-v0", {"split": "eval"})
    registry.check_split("test/Undeclared-v0", {})  # no split asked for: nothing to check
    problems = check_agent_env("test/Undeclared-v0")
    assert len(problems) == 1 and problems[0].startswith("eval split:") and "has_eval_split" in problems[0]
    assert any("eval split" in p for p in check_agent_env(Undeclared()))


def test_declared_no_split_drops_it_with_one_warning(clean_registry):
    registry.register("test/NoHeldOut-v0", NoHeldOut)
    with pytest.warns(UserWarning, match=r"test/NoHeldOut-v0.*no held-out tasks.*split='eval' is ignored"):
        env = registry.make("test/NoHeldOut-v0", split="eval")
    assert isinstance(env, NoHeldOut)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per id: a 500-task eval does not print 500 warnings
        registry.make("test/NoHeldOut-v0", split="eval")
        registry.make("test/NoHeldOut-v0", split="train")
    assert check_agent_env("test/NoHeldOut-v0") == [] and check_agent_env(NoHeldOut()) == []
    registry.check_split("test/NoHeldOut-v0", {"split": "eval"})


def test_registration_can_declare_for_a_factory(clean_registry):
    registry.register("test/Fn-v0", lambda: Undeclared(), has_eval_split=False)
    with pytest.warns(UserWarning, match="no held-out tasks"):
        registry.make("test/Fn-v0", split="eval")
    with pytest.raises(registry.RegistryError, match="has_eval_split must be"):
        registry.register("test/Bad-v0", Undeclared, has_eval_split="no")


def test_env_with_a_split_passes_and_one_that_holds_out_nothing_is_reported(clean_registry):
    registry.register("test/WithSplit-v0", WithSplit)
    env = registry.make("test/WithSplit-v0", split="eval")
    assert env.reset(seed=0)[1]["task"] != registry.make("test/WithSplit-v0").reset(seed=0)[1]["task"]
    assert check_agent_env("test/WithSplit-v0") == [] and check_agent_env(WithSplit()) == []
    registry.check_split("test/WithSplit-v0", {"split": "eval"})
    registry.check_split("judged", {"split": "eval"})  # **kwargs: told apart only by make
    registry.register("test/Same-v0", SplitButSameTasks)
    problems = check_agent_env("test/Same-v0")
    assert len(problems) == 1 and "same tasks as training" in problems[0]


def test_builtins_declare_their_split():
    assert registry.spec("code_exec").has_eval_split is True and registry.spec("noop").has_eval_split is False
    assert registry.spec("Concise-v0").has_eval_split is False
    a = registry.make("code_exec").reset(seed=0)[1]["task"]["id"]
    b = registry.make("code_exec", split="eval").reset(seed=0)[1]["task"]["id"]
    assert a != b and "-eval-" in b


def test_a_run_of_an_undeclared_env_fails_before_training(clean_registry, tmp_path):
    """The run's held-out eval env is checked when the run is built: no training, no silent 0 eval."""
    from agentrl.config.plan import resolve
    from agentrl.config.schema import load_config
    from agentrl.jobs.build import eval_env_factory

    registry.register("test/Undeclared-v0", Undeclared)
    cfg = load_config(overrides=["env.id=test/Undeclared-v0", f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="has_eval_split"):
        eval_env_factory(resolve(cfg, "run"))
