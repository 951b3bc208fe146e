"""`agentrl setup sglang` through typer's CliRunner, with the install's commands played by a fake (nothing is
downloaded; the install itself: tests/engine/test_sglang_install.py)."""

import pytest
from typer.testing import CliRunner

from agentrl.cli.main import app
from agentrl.engine.sglang import install as si

runner = CliRunner()


def test_help_names_the_command_and_its_options():
    res = runner.invoke(app, ["--help"], terminal_width=200)
    assert res.exit_code == 0 and "setup" in res.output
    res = runner.invoke(app, ["setup", "sglang", "--help"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "--python" in res.output and "--quiet" in res.output and "sglang-venv" in res.output


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """Every command the install runs: the venv is made, the probes answer from ``state``, pip fails when
    ``state["fail"]`` is set."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    state = {"installed": None, "fail": None}

    def run(cmd, on_line):
        if cmd[1:3] == ["-m", "venv"]:
            (tmp_path / "sglang-venv" / "bin").mkdir(parents=True)
            (tmp_path / "sglang-venv" / "bin" / "python").touch()
        elif cmd[1:3] == ["-m", "pip"]:
            on_line("Collecting sglang")
            if state["fail"]:
                on_line(state["fail"])
                return 1
            state["installed"] = si.SGLANG_VERSION
        elif state["installed"]:
            on_line(state["installed"])
        else:
            return 1
        return 0

    monkeypatch.setattr(si, "run_streaming", run)
    return state


def test_install_then_already_installed(fake_pip, tmp_path):
    res = runner.invoke(app, ["setup", "sglang"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "[2/3] pip install sglang==" in res.output and "Collecting sglang" in res.output
    assert f"sglang {si.SGLANG_VERSION} installed in {tmp_path / 'sglang-venv'}" in res.output
    res = runner.invoke(app, ["setup", "sglang", "-q"], terminal_width=200)
    assert res.exit_code == 0 and res.output.strip() == f"sglang {si.SGLANG_VERSION} already installed in " + str(
        tmp_path / "sglang-venv"
    )


def test_a_pip_failure_exits_non_zero_with_one_error_line(fake_pip, tmp_path):
    fake_pip["fail"] = "ERROR: Could not find a version that satisfies the requirement sglang"
    res = runner.invoke(app, ["setup", "sglang", "--quiet"], terminal_width=400)
    assert res.exit_code == 1
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert "pip install sglang==" in line and "Could not find a version" in line
    assert line.endswith(f"full log: {tmp_path / 'sglang-install.log'}")
    assert "Collecting sglang" not in res.output  # --quiet: pip's lines only in the log
