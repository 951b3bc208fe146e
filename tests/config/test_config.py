import pytest
import yaml

from agentrl.config.schema import RunConfig, field_docs, load_config, parse_override, save_config
from agentrl.errors import ConfigError


def test_defaults_and_overrides(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("rollout:\n  group_size: 3\n  temperature: 1\nenv:\n  kwargs: {difficulty: 2}\n")
    cfg = load_config([f], ["rollout.group_size=8", "env.kwargs={parser: python_block}"])
    assert cfg.rollout.group_size == 8
    assert cfg.rollout.temperature == 1.0 and isinstance(cfg.rollout.temperature, float)
    assert cfg.env.kwargs == {"difficulty": 2, "parser": "python_block"}  # layers merge (test_merge.py)
    assert isinstance(cfg, RunConfig)


@pytest.mark.parametrize(
    "override,needle",
    [
        ("rollout.grup_size=2", "unknown key(s) ['grup_size']"),
        ("bogus=1", "config: unknown key(s) ['bogus']"),
        ("rollout.group_size=abc", "rollout.group_size: expected int, got 'abc'"),
        ("rollout.group_size=0", "rollout.group_size: 0 is below the minimum 1"),
        ("rollout.top_p=2", "rollout.top_p: 2.0 is above the maximum 1.0"),
        ("model.dtype=int4", "model.dtype: 'int4' is not one of"),
        ("trainer.rollout_correction=icepep", "trainer.rollout_correction: 'icepep' is not one of"),
        ("algo.reward_normalization=gpdo", "algo.reward_normalization: 'gpdo' is not one of"),
        ("algo.reward_weights=2", "algo.reward_weights: expected"),
        ("trainer.rollout_correction_high=0.5", "trainer.rollout_correction_high: 0.5 is below the minimum 1.0"),
        ("trainer.rollout_correction_low=2", "trainer.rollout_correction_low: 2.0 is above the maximum 1.0"),
        ("rollout=5", "rollout: expected a mapping"),
        ("novalue", "expected KEY=VALUE"),
    ],
)
def test_bad_values_are_named(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config([], [override])
    assert needle in str(e.value)


def test_missing_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config([tmp_path / "nope.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config([bad])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config([], ["rollout.max_turns=3", "model.path=/x"])
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config([tmp_path / "c.yaml"])
    assert again == cfg


def test_every_field_documented():
    undocumented = [name for name, text, _ in field_docs() if not text]
    assert undocumented == []


def test_config_docs_list_the_distillation_fields():
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    res = CliRunner().invoke(app, ["config", "--docs"], terminal_width=400)
    assert res.exit_code == 0, res.output
    for name in ("algo.opd_coef", "algo.teacher", "trainer.opd_coef", "trainer.teacher_path"):
        assert name in res.output
        assert dict((n, t) for n, t, _ in field_docs())[name]


def test_shipped_configs_load():
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
    assert files, "configs/ should ship at least one YAML file"
    for f in files:
        load_config([f])


def test_parse_override_yaml_types():
    assert parse_override("a.b=[1, 2]") == {"a": {"b": [1, 2]}}
    assert parse_override("a=null") == {"a": None}
    assert yaml.safe_load("x") == "x"
