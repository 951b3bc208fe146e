"""The skip policy (tests/components.py): a skip names its component; where AGENTRL_REQUIRE names that component,
or the skip names none, the test fails instead. Run on a small inner suite in a subprocess, as CI runs the real one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import components
import pytest

HERE = Path(__file__).resolve().parent

INNER = """
import components
import pytest

@pytest.mark.skipif(True, reason=components.reason("docker", "no daemon"))
def test_marked():
    pass

def test_docker():
    components.unavailable("docker", "no daemon")

def test_gpu():
    components.unavailable("no-gpu", "this machine has a GPU")

def test_untagged():
    pytest.skip("some reason")

def test_passes():
    pass
"""
INNER_MODULE = """
import components
import pytest

pytest.importorskip("no_such_module_here", reason=components.reason("docker", "module-level"))

def test_never():
    pass
"""


def _inner(tmp_path: Path, require: str, module: str = INNER) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(
        "from components import pytest_make_collect_report, pytest_report_header, pytest_runtest_makereport\n"
    )
    (tmp_path / "test_inner.py").write_text(module)
    env = {**os.environ, "AGENTRL_REQUIRE": require, "PYTHONPATH": str(HERE)}
    cmd = [sys.executable, "-m", "pytest", "-rsf", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


def test_without_require_every_missing_component_skips_with_its_tag(tmp_path):
    p = _inner(tmp_path, "")
    assert p.returncode == 0, p.stdout[-2000:]
    assert "1 passed, 4 skipped" in p.stdout and "[docker] no daemon" in p.stdout, p.stdout[-2000:]
    assert "required components (AGENTRL_REQUIRE): none" in p.stdout


def test_require_turns_required_and_untagged_skips_into_failures(tmp_path):
    p = _inner(tmp_path, "docker,sglang")
    out = p.stdout
    assert p.returncode == 1, out[-2000:]
    # docker (a mark: an error at setup; a call) and the untagged skip fail; the no-gpu skip stays a skip
    assert "2 failed, 1 passed, 1 skipped, 1 error" in out, out[-2000:]
    assert "requires 'docker'" in out and "names no component" in out
    assert "required components (AGENTRL_REQUIRE): docker, sglang" in out


def test_a_module_skipped_at_import_fails_where_its_component_is_required(tmp_path):
    assert _inner(tmp_path, "", INNER_MODULE).returncode == 5  # skipped: no test ran
    p = _inner(tmp_path, "docker", INNER_MODULE)
    assert p.returncode != 0 and "requires 'docker': Skipped: [docker] module-level" in p.stdout, p.stdout[-2000:]


def test_unknown_components_are_refused():
    assert components.parse(" docker, sglang ,") == {"docker", "sglang"}
    with pytest.raises(ValueError, match="dockr"):
        components.parse("docker,dockr")
    with pytest.raises(ValueError, match="unknown component 'gpus'"):
        components.reason("gpus", "x")
    assert components.tag_of("Skipped: [ray] Ray is not installed") == "ray"
    assert components.tag_of("Ray is not installed") is None
