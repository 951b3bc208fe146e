"""`agentrl setup sglang`'s install (agentrl.engine.sglang.install) against a fake runner: no virtualenv is made and
nothing is downloaded. The fake plays python -m venv, pip and the version probes, and records every command."""

import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.engine.sglang import install as si

ROOT = Path(__file__).resolve().parents[2]


class FakeMachine:
    """Runs nothing: a venv creation makes ``bin/python`` (an empty file), pip "installs" ``installs`` (or fails
    printing ``pip_error``), and the probes print the installed version (exit 1 when there is none)."""

    def __init__(self, installed: str | None = None, installs: str = si.SGLANG_VERSION, pip_error: str | None = None):
        self.installed, self.installs, self.pip_error = installed, installs, pip_error
        self.calls: list[list[str]] = []

    def __call__(self, cmd, on_line) -> int:
        cmd = list(cmd)
        self.calls.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            py = Path(cmd[3]) / "bin" / "python"
            py.parent.mkdir(parents=True)
            py.touch()
            return 0
        if cmd[1:4] == ["-m", "pip", "install"]:
            on_line(f"Collecting {cmd[-1]}")
            if self.pip_error:
                on_line(self.pip_error)
                on_line("[notice] A new release of pip is available")
                return 1
            self.installed = self.installs
            on_line(f"Successfully installed {cmd[-1]}")
            return 0
        if cmd[1] == "-c":
            if self.installed is None:
                on_line("sglang not found")
                return 1
            on_line(self.installed)
            return 0
        raise AssertionError(f"unexpected command {cmd}")

    def kinds(self) -> list[str]:
        return [
            "venv" if c[1:3] == ["-m", "venv"] else "pip" if c[1:3] == ["-m", "pip"] else "probe" for c in self.calls
        ]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_where_it_installs_follows_agentrl_cache(cache):
    assert si.venv_dir() == cache / "sglang-venv"
    assert si.venv_python() == cache / "sglang-venv" / "bin" / "python"
    from agentrl.engine.sglang.server import SGLANG_VERSION, sglang_python

    assert SGLANG_VERSION == si.SGLANG_VERSION  # one pin, re-exported where the launcher lives
    si.venv_python().parent.mkdir(parents=True)
    si.venv_python().touch()
    assert sglang_python() == str(si.venv_python())


def test_a_fresh_install_builds_the_venv_then_pins_sglang(cache):
    fake, said, echoed = FakeMachine(), [], []
    got = si.install(python="/usr/bin/python3.11", say=said.append, echo=echoed.append, runner=fake)
    venv = cache / "sglang-venv"
    py = str(venv / "bin" / "python")
    assert got.venv == venv and got.version == si.SGLANG_VERSION and not got.already
    assert fake.kinds() == ["venv", "pip", "probe"]  # no probe first: there was no python to ask
    assert fake.calls[0] == ["/usr/bin/python3.11", "-m", "venv", str(venv)]
    assert fake.calls[1] == [py, "-m", "pip", "install", "--progress-bar", "off", f"sglang=={si.SGLANG_VERSION}"]
    assert fake.calls[2] == [py, "-c", si.IMPORT_PROBE]  # the install is proven by an import
    assert [s.split(" ")[0] for s in said if s.startswith("[")] == ["[1/3]", "[2/3]", "[3/3]"]
    assert f"Successfully installed sglang=={si.SGLANG_VERSION}" in echoed  # pip's own lines reach the user
    log = (cache / "sglang-install.log").read_text()
    assert f"sglang=={si.SGLANG_VERSION}" in log and "Successfully installed" in log


def test_a_second_install_is_a_no_op_that_says_so(cache):
    fake = FakeMachine()
    si.install(say=lambda s: None, runner=fake)
    fake.calls.clear()
    said = []
    got = si.install(say=said.append, runner=fake)
    assert got.already and fake.kinds() == ["probe"] and fake.calls[0][1:] == ["-c", si.VERSION_PROBE]
    assert said == [f"sglang {si.SGLANG_VERSION} already installed in {cache / 'sglang-venv'}"]


def test_another_version_is_replaced_in_the_same_venv(cache):
    si.venv_python().parent.mkdir(parents=True)
    si.venv_python().touch()
    fake, said = FakeMachine(installed="0.4.0"), []
    si.install(say=said.append, runner=fake)
    assert fake.kinds() == ["probe", "pip", "probe"]  # the venv is reused, pip upgrades in it
    assert any("has sglang 0.4.0" in s for s in said) and any("reusing" in s for s in said)


def test_a_pip_failure_is_one_line_naming_the_step_the_reason_and_the_log(cache):
    fake = FakeMachine(pip_error="ERROR: No matching distribution found for sglang==0.5.23")
    with pytest.raises(si.InstallError) as info:
        si.install(say=lambda s: None, runner=fake)
    msg = str(info.value)
    log = cache / "sglang-install.log"
    assert "\n" not in msg
    assert msg.startswith(f"pip install sglang=={si.SGLANG_VERSION} into {cache / 'sglang-venv'} failed (exit 1): ")
    assert "ERROR: No matching distribution found" in msg  # pip's error, not its later notice
    assert msg.endswith(f"; full log: {log}") and "No matching distribution" in log.read_text()
    fake.pip_error = None  # the half-made venv is reused by the next attempt
    fake.calls.clear()
    si.install(say=lambda s: None, runner=fake)
    assert fake.kinds() == ["probe", "pip", "probe"]


def test_a_missing_interpreter_is_named(cache):
    with pytest.raises(si.InstallError, match=r"creating the virtualenv .* with /no/such/python failed \(exit 127\)"):
        si.install(python="/no/such/python", say=lambda s: None)  # the real runner: nothing can start


def test_an_install_that_imports_another_version_fails(cache):
    fake = FakeMachine(installs="0.5.0")
    with pytest.raises(si.InstallError, match=f"imports sglang 0.5.0, not the pinned {si.SGLANG_VERSION}"):
        si.install(say=lambda s: None, runner=fake)


def test_the_ci_entry_point_runs_without_agentrls_dependencies():
    """.ci/install_sglang.sh runs the module from the checkout before agentrl's dependencies are installed: it
    imports nothing beyond the standard library (here it runs with -I -S: no site-packages at all)."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); from agentrl.engine.sglang import install as m; m.main(['-h'])"
    res = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(ROOT)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "--python" in res.stdout
    assert "-m agentrl.engine.sglang.install" in (ROOT / ".ci" / "install_sglang.sh").read_text()
