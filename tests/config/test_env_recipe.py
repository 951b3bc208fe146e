"""An env's run recipe (``agentrl.envs.recipes``): the layer every job naming the env lays under the
user's own. ``agentrl run --env textworld`` gets TextWorld's settings; whatever the user sets wins."""

from __future__ import annotations

import pytest

from agentrl.config.schema import load_config
from agentrl.envs import registry
from agentrl.envs.recipes import TEXTWORLD
from agentrl.errors import RegistryError


@pytest.mark.parametrize("env_id", ["textworld", "TextWorld-v0"])
def test_textworld_runs_on_its_recipe(env_id):
    cfg = load_config(base={"env": {"id": env_id}, "algo": {"name": "grpo"}})
    assert cfg.model.path == "builtin:textworld"
    assert cfg.env.id == env_id and cfg.env.kwargs == {"difficulty": 1}
    assert (cfg.rollout.max_turns, cfg.rollout.max_context) == (30, 4096)
    assert cfg.algo.gamma == TEXTWORLD["algo"]["gamma"]


def test_the_users_layers_win_over_the_recipe(tmp_path):
    f = tmp_path / "tw.yaml"
    f.write_text("env:\n  id: textworld\nrollout:\n  max_turns: 12\n")
    cfg = load_config(
        [f], ["env.kwargs.split=eval", "model.path=/some/model"], base={"env": {"id": "code_exec"}}
    )  # the CLI's default --env below a file that names textworld: the file's env decides
    assert cfg.rollout.max_turns == 12 and cfg.model.path == "/some/model"
    assert cfg.env.kwargs == {"difficulty": 1, "split": "eval"}  # the recipe's kwargs kept, the user's merged
    assert cfg.rollout.max_new_tokens == TEXTWORLD["rollout"]["max_new_tokens"]
    cleared = load_config([], ["env.id=textworld", "env.kwargs={}"])
    assert cleared.env.kwargs == {}


def test_an_env_without_a_recipe_keeps_the_embedded_defaults():
    assert load_config(base={"env": {"id": "code_exec"}}) == load_config()
    assert load_config().model.path is None


def test_a_registered_env_brings_its_recipe(clean_registry):
    registry.register("recipetest/Maze-v0", "mypkg.maze:Maze", run_defaults={"rollout": {"max_turns": 50}})
    assert load_config([], ["env.id=recipetest/Maze-v0"]).rollout.max_turns == 50
    with pytest.raises(RegistryError, match="run_defaults"):
        registry.register("recipetest/Bad-v0", "mypkg.maze:Maze", run_defaults=["rollout"])
    with pytest.raises(RegistryError, match="already registered"):  # a different recipe is a different env
        registry.register("recipetest/Maze-v0", "mypkg.maze:Maze", run_defaults={"rollout": {"max_turns": 40}})
