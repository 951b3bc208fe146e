"""`agentrl sandbox ...` through typer's CliRunner: exec (local and one real docker run), build, ps, clean."""

import base64
import json

import components
import pytest
from typer.testing import CliRunner

from agentrl.cli.main import app

runner = CliRunner()


def _docker_reason():
    from agentrl.sandbox.docker import unavailable_reason

    return unavailable_reason()


def _json(output: str) -> dict:
    return json.loads(output[output.index("{") :])


def test_exec_local_prints_the_result_as_json(tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"data")
    res = runner.invoke(
        app,
        [
            "sandbox",
            "exec",
            "--backend",
            "local",
            "--timeout",
            "10",
            "--file",
            f"a.txt={src}",
            "--collect",
            "b.txt",
            "--",
            "sh",
            "-c",
            "cat a.txt > b.txt; echo hi; exit 4",
        ],
    )
    assert res.exit_code == 0, res.output
    out = _json(res.output)
    assert (out["status"], out["exit_code"], out["stdout"], out["backend"]) == ("ok", 4, "hi\n", "local")
    assert base64.b64decode(out["files"]["b.txt"]) == b"data"


def test_exec_local_timeout_status():
    res = runner.invoke(app, ["sandbox", "exec", "--timeout", "0.5", "--", "sleep", "30"])
    assert res.exit_code == 0, res.output
    assert _json(res.output)["status"] == "timeout"


def test_exec_bad_input_is_one_clear_error():
    res = runner.invoke(app, ["sandbox", "exec", "--backend", "nope", "--", "true"])
    assert res.exit_code == 2 and "nope" in res.output
    res = runner.invoke(app, ["sandbox", "exec", "--memory", "0", "--", "true"])
    assert res.exit_code == 2 and "memory_mb" in res.output
    res = runner.invoke(app, ["sandbox", "exec", "--file", "noequals", "--", "true"])
    assert res.exit_code == 2 and "NAME=PATH" in res.output


@pytest.mark.docker
def test_exec_docker_ps_clean_build():
    reason = _docker_reason()
    if reason is not None:
        components.unavailable("docker", f"docker sandbox unavailable: {reason}")
    from agentrl.sandbox.docker.daemon import list_containers

    res = runner.invoke(
        app,
        [
            "sandbox",
            "exec",
            "--backend",
            "docker",
            "--memory",
            "128",
            "--timeout",
            "20",
            "--",
            "python3",
            "-c",
            "import os; print(os.getuid(), sorted(os.listdir('/sys/class/net')))",
        ],
    )
    assert res.exit_code == 0, res.output
    out = _json(res.output)
    assert (out["status"], out["stdout"], out["backend"]) == ("ok", "1000 ['lo']\n", "docker"), out
    res = runner.invoke(
        app,
        [
            "sandbox",
            "exec",
            "--backend",
            "docker",
            "--memory",
            "64",
            "--timeout",
            "20",
            "--",
            "python3",
            "-c",
            "a = bytearray(2**30)",
        ],
    )
    assert _json(res.output)["status"] == "oom", res.output

    res = runner.invoke(app, ["sandbox", "ps", "--json"])
    assert res.exit_code == 0, res.output
    assert isinstance(json.loads(res.output), list)
    res = runner.invoke(app, ["sandbox", "clean", "--stale"])
    assert res.exit_code == 0 and "removed" in res.output, res.output
    # exec removed its own container: nothing of a dead owner is left for a sweep either
    from agentrl.sandbox.docker.daemon import owner_alive

    assert not [c for c in list_containers() if owner_alive(c["owner"]) is False]
    res = runner.invoke(app, ["sandbox", "build"])  # the image exists: a no-op that says so
    assert res.exit_code == 0 and "already built" in res.output, res.output
