"""How config layers combine: mappings merge key by key at every depth (env.kwargs included), an
empty mapping clears, a layer that changes env.id starts env.kwargs afresh."""

import pytest

from agentrl.common.typed_tree import deep_merge
from agentrl.config.schema import load_config


def test_repeated_set_on_one_dict_merges():
    cfg = load_config([], ["env.kwargs.split=eval", "env.kwargs.difficulty=3"])
    assert cfg.env.kwargs == {"split": "eval", "difficulty": 3}
    cfg = load_config([], ["eval.env_kwargs.difficulty=2"])  # merges with what the layers gave, not the default
    assert cfg.eval.env_kwargs == {"difficulty": 2}
    cfg = load_config([], ["eval.env_kwargs.difficulty=2", "eval.env_kwargs={tools: [python]}"])
    assert cfg.eval.env_kwargs == {"difficulty": 2, "tools": ["python"]}


def test_a_file_and_sets_merge_and_a_later_value_wins(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("env:\n  id: code_exec\n  kwargs: {difficulty: 1, parser: hermes}\n")
    b.write_text("env:\n  kwargs: {difficulty: 4}\n")
    cfg = load_config([a, b], ["env.kwargs.tools=[python, bash]"])
    assert cfg.env.kwargs == {"difficulty": 4, "parser": "hermes", "tools": ["python", "bash"]}


def test_an_empty_mapping_clears_what_lower_layers_set(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("env:\n  kwargs: {difficulty: 1}\n")
    assert load_config([f], ["env.kwargs={}"]).env.kwargs == {}
    assert load_config([f], ["env.kwargs={}", "env.kwargs.split=eval"]).env.kwargs == {"split": "eval"}
    assert load_config([], ["eval.env_kwargs={}"]).eval.env_kwargs == {}  # drops the default split=eval


@pytest.mark.parametrize(
    "sets, kwargs",
    [
        (["env.kwargs.difficulty=2", "env.id=concise"], {}),  # kwargs of code_exec do not follow to concise
        (["env.kwargs.difficulty=2", "env.id=code_exec"], {"difficulty": 2}),  # the same env keeps them
        (["env.id=concise", "env.kwargs.max_words=5", "env.id=code_exec"], {}),
        (["env.kwargs.difficulty=2", "env={id: concise, kwargs: {max_words: 5}}"], {"max_words": 5}),
    ],
)
def test_changing_env_id_starts_its_kwargs_afresh(sets, kwargs):
    assert load_config([], sets).env.kwargs == kwargs


def test_a_command_default_layer_is_overridden_by_files_and_sets(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("env:\n  id: concise\n  kwargs: {max_words: 5}\n")
    cfg = load_config([f], ["env.kwargs.min_words=1"], base={"env": {"id": "code_exec"}})
    assert (cfg.env.id, cfg.env.kwargs) == ("concise", {"max_words": 5, "min_words": 1})


def test_options_given_on_the_command_line_win_over_files_and_lose_to_sets(tmp_path):
    from agentrl.cli.main import _rollout_base, _rollout_given, _run_base, _run_given

    f = tmp_path / "recipe.yaml"
    f.write_text(
        "output_dir: runs/recipe\nrollout: {group_size: 8, num_prompts: 4}\nenv: {kwargs: {difficulty: [3, 4]}}\n"
    )
    cfg = load_config([f], [], base=_rollout_base(), given=_rollout_given(group_size=1, out="elsewhere"))
    assert (cfg.output_dir, cfg.rollout.group_size, cfg.rollout.num_prompts) == ("elsewhere", 1, 4)
    assert cfg.env.kwargs == {"difficulty": [3, 4]}  # --env not given: the file's env and kwargs stay
    cfg = load_config([f], ["rollout.group_size=2"], base=_rollout_base(), given=_rollout_given(group_size=1))
    assert cfg.rollout.group_size == 2
    cfg = load_config([f], [], base=_run_base(), given=_run_given(steps=3, algo="rloo"))
    assert (cfg.train.steps, cfg.algo.name, cfg.output_dir) == (3, "rloo", "runs/recipe")
    cfg = load_config([], [], base=_run_base("concise", "rloo"), given=_run_given("concise", "rloo"))
    assert (cfg.env.id, cfg.algo.name, cfg.output_dir) == ("concise", "rloo", "runs/concise-rloo")


def test_deep_merge_rule_itself():
    assert deep_merge({"a": {"b": 1, "c": {"d": 1}}}, {"a": {"c": {"e": 2}}}) == {"a": {"b": 1, "c": {"d": 1, "e": 2}}}
    assert deep_merge({"a": {"b": 1}}, {"a": {}}) == {"a": {}}
    assert deep_merge({"a": {"b": 1}}, {"a": 3}) == {"a": 3}
    assert deep_merge({"a": 3}, {"a": {"b": 1}}) == {"a": {"b": 1}}
