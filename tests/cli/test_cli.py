"""The `agentrl` command line, run in-process (typer's CliRunner) and once as the installed binary."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import components
import pytest
from typer.testing import CliRunner

from agentrl.cli.main import app
from agentrl.trajectory import load

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def test_envs_lists_builtins():
    res = runner.invoke(app, ["envs"])
    assert res.exit_code == 0, res.output
    assert "code_exec" in res.output and "CodeExec-v0" in res.output


def test_rollout_writes_trajectories_config_and_metrics(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "rollout",
            "--env",
            "code_exec",
            "--model",
            str(tiny_model_dir),
            "-n",
            "2",
            "-g",
            "2",
            "-o",
            str(out),
            "--set",
            "rollout.max_new_tokens=16",
            "--set",
            "rollout.max_turns=2",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "rollout summary" in res.output or "rollout: code_exec" in res.output
    trajs = load(out / "trajectories.jsonl")
    assert len(trajs) == 4
    for t in trajs:
        t.validate()
        assert t.prompt_len > 0 and t.num_sampled > 0
        assert all(v == 0 for v, m in zip(t.versions, t.loss_mask) if m)  # sampled by policy version 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["episodes"] == 4
    assert "rollout:" in (out / "config.yaml").read_text()


def test_bad_override_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["rollout", "--set", "rollout.group_sise=2", "-o", str(tmp_path)])
    assert res.exit_code == 2
    assert "group_sise" in res.output


def test_unknown_env_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["rollout", "--env", "code_exce", "-o", str(tmp_path)])
    assert res.exit_code == 2
    assert "code_exce" in res.output and "code_exec" in res.output  # names the bad id and a close match


def test_check_template_on_qwen_tokenizer(tiny_model_dir):
    res = runner.invoke(app, ["check-template", "--model", str(tiny_model_dir)])
    assert res.exit_code == 0, res.output
    assert "prefix" in res.output


def test_check_template_bad_path(tmp_path):
    res = runner.invoke(app, ["check-template", "--model", str(tmp_path / "missing")])
    assert res.exit_code == 2


def test_config_docs_lists_every_field():
    res = runner.invoke(app, ["config", "--docs"], terminal_width=200)
    assert res.exit_code == 0
    assert "rollout.group_size" in res.output


def test_installed_binary_runs():
    exe = shutil.which("agentrl")
    if exe is None:
        components.unavailable("installed", "the agentrl console script is not on PATH (package not pip-installed)")
    res = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "rollout" in res.stdout


def test_readme_commands_match_ci():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    assert len(block) == 2, "README starts with exactly two commands"
    assert "agentrl run --env code_exec --algo grpo" in block[0]
    assert block[1] in (ROOT / ".ci" / "run").read_text(), "the CI script must run README's test command"


@pytest.mark.parametrize("args", [["config", "--env", "code_exec"], ["run", "--no-such-flag"], ["nosuchcommand"]])
def test_a_usage_mistake_is_a_usage_error_not_an_internal_one(args):
    """Unknown options and commands are click's usage errors (exit 2, its own message), never reported as
    an agentrl bug ("internal error"), whichever copy of click typer uses."""
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "internal error" not in res.output
    assert "No such" in res.output
