"""Every `agentrl` command takes -c/--config and --set (or refuses them saying why), `agentrl --version`,
and `agentrl run` never silently reuses a run directory. In process through typer's CliRunner."""

import importlib.metadata
import json
import re
from pathlib import Path

import components
import pytest
from scripted_openai import ScriptedOpenAI
from typer.testing import CliRunner

import agentrl
from agentrl.cli import eval as eval_cli
from agentrl.cli import report as report_cli
from agentrl.cli import serve as serve_cli
from agentrl.cli.main import app
from agentrl.cli.options import named
from agentrl.cli.sft import dotted_sets
from agentrl.errors import AgentRLError

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "AGENTRL_TEST_OPTIONS_KEY"


def _yaml(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _invoke(argv):
    return runner.invoke(app, argv, terminal_width=400)


# -- --version -------------------------------------------------------------------------------------
def test_version_prints_the_package_version():
    res = _invoke(["--version"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"agentrl {agentrl.__version__}"


def test_version_matches_pyproject_and_the_installed_distribution():
    project = (ROOT / "pyproject.toml").read_text().split("[project]", 1)[1]  # tomllib is 3.11+, agentrl 3.10+
    declared = re.search(r'^version\s*=\s*"([^"]+)"', project, re.M).group(1)
    assert agentrl.__version__ == declared
    try:
        installed = importlib.metadata.version("agentrl")
    except importlib.metadata.PackageNotFoundError:
        components.unavailable(
            "installed", "agentrl is not pip-installed here, so there is no distribution version to compare"
        )
    assert installed == agentrl.__version__


# -- every command declares the shared options ---------------------------------------------------
def _commands() -> list[str]:
    """Every top-level command registered on the app (sub-apps such as `sandbox` aside: README says why)."""
    import typer

    group = typer.main.get_command(app)
    return sorted(name for name, cmd in group.commands.items() if not hasattr(cmd, "commands"))


COMMANDS = _commands()


def test_the_commands_are_found():
    assert {"run", "rollout", "config", "eval", "sft", "serve", "report", "check-template", "envs"} <= set(COMMANDS)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_documents_config_and_set(cmd):
    res = _invoke([cmd, "--help"])
    assert res.exit_code == 0, res.output
    assert "--config" in res.output and "-c" in res.output and "--set" in res.output


BAD_KEY = {  # command -> argv (before the options) that fails on the bad key before doing any work
    "run": ["run"],
    "rollout": ["rollout"],
    "config": ["config"],
    "eval": ["eval", "--model", "openai/x"],
    "sft": ["sft"],
    "serve": ["serve", "/nonexistent-model"],
    "report": ["report", "/nonexistent-run"],
    "check-template": ["check-template", "--model", "/nonexistent-model"],
}


@pytest.mark.parametrize("cmd", sorted(BAD_KEY))
def test_a_bad_key_in_set_or_in_a_file_is_named(cmd, tmp_path):
    res = _invoke([*BAD_KEY[cmd], "--set", "rollout.max_turnz=3"])
    assert res.exit_code == 2, res.output
    assert "max_turnz" in res.output and "max_turns" in res.output  # the bad key and the valid ones
    res = _invoke([*BAD_KEY[cmd], "-c", _yaml(tmp_path / "c.yaml", "rollout:\n  temperature: hot\n")])
    assert res.exit_code == 2, res.output
    assert "rollout.temperature" in res.output and "hot" in res.output


def test_envs_refuses_a_config_saying_why(tmp_path):
    res = _invoke(["envs", "--set", "env.id=noop"])
    assert res.exit_code == 2
    assert "takes no config" in res.output and "env.id=noop" in res.output and "agentrl config" in res.output


# -- named(): which fields the user gave -----------------------------------------------------------
def test_named_lists_the_dotted_fields_of_files_and_sets(tmp_path):
    f = _yaml(tmp_path / "c.yaml", "rollout:\n  seed: 3\nenv: {id: noop}\n")
    got = named([f], ["model.device=cuda"])
    assert {"rollout", "rollout.seed", "env.id", "model.device"} <= got
    assert "rollout.temperature" not in got and named(None, None) == set()


# -- eval -----------------------------------------------------------------------------------------
def test_eval_settings_flag_over_config_over_default(tmp_path):
    f = _yaml(tmp_path / "c.yaml", "env: {id: noop, kwargs: {n_turns: 2}}\nrollout: {max_new_tokens: 77, seed: 5}\n")
    s = eval_cli.settings([f], ["rollout.temperature=0.3"], max_tokens=None, seed=9)
    assert s["env"] == "noop" and s["env_kwargs"] == {"n_turns": 2}
    assert (s["max_tokens"], s["temperature"], s["seed"]) == (77, 0.3, 9)  # config, --set, flag
    assert (s["concurrency"], s["max_turns"], s["top_p"], s["episode_timeout_s"]) == (8, None, None, 1800.0)  # defaults
    assert eval_cli.settings(None, None)["temperature"] is None  # the provider's, as before
    assert eval_cli.settings([f], None, env="code_exec")["env_kwargs"] == {}  # kwargs belong to their env


def test_eval_command_sends_what_the_config_names(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-options-0123456789")
    f = _yaml(tmp_path / "c.yaml", "env: {id: noop}\nrollout: {max_new_tokens: 77, temperature: 0.25, max_turns: 1}\n")
    out = tmp_path / "ev.jsonl"
    with ScriptedOpenAI([{"content": "hello"}]) as srv:
        res = _invoke(
            [
                "eval",
                "--model",
                "openai/scripted",
                "--api-base",
                srv.url,
                "--api-key-env",
                KEY_ENV,
                "-n",
                "2",
                "-o",
                str(out),
                "-q",
                "-c",
                str(f),
                "--set",
                "rollout.seed=4",
                "--max-tokens",
                "99",
            ]
        )
    assert res.exit_code == 0, res.output
    body = srv.requests[0]["body"]
    assert body["max_tokens"] == 99 and body["temperature"] == 0.25  # the flag wins, the config's field is used
    summary = json.loads(out.with_name("ev.summary.json").read_text())
    assert summary["env"] == "noop" and summary["seed"] == 4 and summary["max_turns"] == 1


# -- serve ----------------------------------------------------------------------------------------
def test_serve_settings_take_the_run_and_engine_from_the_config(tmp_path):
    f = _yaml(
        tmp_path / "c.yaml", f"output_dir: {tmp_path / 'run'}\nmodel: {{dtype: bfloat16}}\nengine: {{kind: local}}\n"
    )
    assert serve_cli.settings([f], None, None, None, None, None) == (str(tmp_path / "run"), "local", "auto", "bfloat16")
    assert serve_cli.settings([f], None, "/m", "sglang", "cuda", None) == ("/m", "sglang", "cuda", "bfloat16")
    assert serve_cli.settings(None, ["model.path=/base"], None, None, None, None)[0] == "/base"
    assert serve_cli.settings(None, None, "/m", None, None, None) == ("/m", "auto", "auto", "auto")
    with pytest.raises(AgentRLError, match="PATH, or a config naming output_dir"):
        serve_cli.settings(None, None, None, None, None, None)


def test_serve_without_anything_to_serve_is_a_clear_error():
    res = _invoke(["serve"])
    assert res.exit_code == 2 and "needs something to serve" in res.output


# -- report ---------------------------------------------------------------------------------------
@pytest.fixture
def spiky_run(tmp_path):
    """A run whose KL jumps 50x for steps 25-26 as reward rises: a kl_spike alert at the default thresholds."""
    d = tmp_path / "run"
    d.mkdir()
    rows = [
        {
            "step": s,
            "rollout/reward_mean": 0.5 + s / 100,
            "train/ppo_kl": 0.01 if s not in (25, 26) else 0.5,
            "train/entropy": 1.0,
            "rollout/tokens_per_episode": 100.0 + (s % 3),
        }
        for s in range(1, 31)
    ]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (d / "config.yaml").write_text("env: {id: code_exec}\nmonitor: {window: 10, retired_knob: 1}\n")
    return d


def test_report_checks_the_metrics_against_the_configs_monitor(spiky_run, tmp_path):
    res = _invoke(["report", str(spiky_run)])
    assert res.exit_code == 0, res.output
    assert "<b>kl_spike</b>" in (spiky_run / "report.html").read_text()
    res = _invoke(["report", str(spiky_run), "--set", "monitor.kl_spike_factor=1000"])
    assert res.exit_code == 0, res.output
    assert "<b>kl_spike</b>" not in (spiky_run / "report.html").read_text()
    f = _yaml(tmp_path / "c.yaml", f"output_dir: {spiky_run}\nmonitor: {{kl_min: 0.9}}\n")  # the run from the config
    res = _invoke(["report", "-c", f, "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert "<b>kl_spike</b>" not in (tmp_path / "r.html").read_text()


def test_report_thresholds_lay_over_the_runs_own(spiky_run):
    run_dir, monitor = report_cli.settings(None, ["monitor.kl_min=0.5"], spiky_run)
    assert run_dir == spiky_run and monitor.kl_min == 0.5 and monitor.window == 10  # unknown old keys dropped
    assert report_cli.settings(None, None, spiky_run) == (spiky_run, None)  # no config: the run's own, as before
    with pytest.raises(AgentRLError, match="RUN_DIR, or a config naming output_dir"):
        report_cli.settings(None, None, None)


# -- sft ------------------------------------------------------------------------------------------
def test_sft_flat_names_become_dotted_with_a_note():
    notes = []
    got = dotted_sets(["lr=1e-3", "sft.steps=3", "output_dir=x", "model.path=/m"], notes.append)
    assert got == ["sft.lr=1e-3", "sft.steps=3", "output_dir=x", "model.path=/m"]
    assert len(notes) == 1 and "sft.lr" in notes[0]


def test_sft_rejects_a_bad_dotted_value_naming_the_field(tmp_path):
    res = _invoke(["sft", "--set", "sft.difficulty=[9]"])
    assert res.exit_code == 2 and "sft.difficulty" in res.output
    res = _invoke(["sft", "-c", _yaml(tmp_path / "c.yaml", "sft:\n  batching: zigzag\n")])
    assert res.exit_code == 2 and "sft.batching" in res.output and "zigzag" in res.output
    res = _invoke(["sft", "--set", "batch_size=0"])  # a flat name: noted, then checked as sft.batch_size
    assert res.exit_code == 2 and "sft.batch_size" in res.output and "deprecated" in res.output


def test_sft_help_lists_dotted_fields():
    res = _invoke(["sft", "--set", "help=1"])
    assert res.exit_code == 0 and "sft.lr" in res.output


@pytest.mark.slow
def test_sft_reads_its_section_and_model_from_a_config(tiny_model_dir, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n"
    )
    f = _yaml(
        tmp_path / "c.yaml", f"model: {{path: {tiny_model_dir}}}\nsft: {{steps: 2, batch_size: 1, device: cpu}}\n"
    )
    res = _invoke(["sft", "-c", f, "--data", str(data), "-o", str(tmp_path / "out"), "-q"])
    assert res.exit_code == 0, res.output
    assert re.search(r"steps\s+│\s+2\b", res.output), res.output


# -- check-template -------------------------------------------------------------------------------
def test_check_template_takes_the_model_from_the_config(tiny_model_dir):
    res = _invoke(["check-template", "--set", f"model.path={tiny_model_dir}"])
    assert res.exit_code == 0, res.output
    assert "prefix" in res.output
    res = _invoke(["check-template"])
    assert res.exit_code == 2 and "--model DIR, or a config naming model.path" in res.output


# -- run: the run-directory rule -------------------------------------------------------------------
def test_run_refuses_a_directory_that_holds_a_run(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    (d / "config.yaml").write_text("env: {id: code_exec}\n")
    res = _invoke(["run", "-o", str(d), "--model", str(tmp_path / "no-model"), "-q"])
    assert res.exit_code == 2
    assert str(d) in res.output and "--resume" in res.output and "--overwrite" in res.output
    assert (d / "config.yaml").read_text() == "env: {id: code_exec}\n"


def test_run_overwrite_moves_the_old_run_aside(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    res = _invoke(["run", "-o", str(d), "--overwrite", "--model", str(tmp_path / "no-model"), "-q"])
    # the run itself then fails on the missing model: the move happened first, nothing was deleted
    assert (tmp_path / "old.old-1" / "metrics.jsonl").read_text() == '{"step": 1}\n', res.output
    assert "no-model" in res.output and "already holds a run" not in res.output


def test_run_resume_is_allowed_into_a_directory_that_holds_a_run(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    (d / "config.yaml").write_text("env: {id: code_exec}\n")
    res = _invoke(["run", "-o", str(d), "--resume", "--model", str(tmp_path / "no-model"), "-q"])
    assert "already holds a run" not in res.output and not (tmp_path / "old.old-1").exists()
    res = _invoke(["run", "-o", str(d), "--set", "train.resume=true", "--overwrite", "-q"])
    assert res.exit_code == 2 and "contradict" in res.output


def test_bad_config_is_reported_before_the_run_dir_is_touched(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    (d / "config.yaml").write_text("x: 1\n")
    res = _invoke(["run", "-o", str(d), "--overwrite", "--set", "train.stepz=1"])
    assert res.exit_code == 2 and "stepz" in res.output and not (tmp_path / "old.old-1").exists()
