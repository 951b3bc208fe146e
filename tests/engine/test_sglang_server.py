"""The SGLang launcher against a real server process (skips, saying why, where SGLang cannot run)."""

import components
import pytest

from agentrl.engine.sglang.server import CPU_FLAGS, SGLangServer
from agentrl.errors import EngineError

pytestmark = pytest.mark.sglang


def test_command_has_the_cpu_flags_once(sglang_model_dir):
    cmd = SGLangServer(sglang_model_dir, port=1234, python="py").command()
    assert cmd[:3] == ["py", "-m", "sglang.launch_server"]
    assert cmd.count("--device") == 1 and all(f in cmd for f in CPU_FLAGS)
    assert "--max-total-tokens" in cmd and "--port" in cmd and "1234" in cmd


def test_bad_model_path_names_it(tmp_path):
    with pytest.raises(EngineError, match="nope"):
        SGLangServer(tmp_path / "nope")


def test_no_api_key_reaches_a_launched_server(sglang_server):
    """The session's server was launched with an API key in agentrl's environment (conftest.SGLANG_CANARY): the
    server's environment has the launcher's own settings and not the key. (Kill and restart of a live server:
    tests/engine/test_sglang_engine.py::test_crash_during_64_concurrent_episodes, on this same server.)"""
    from conftest import SGLANG_CANARY

    assert sglang_server.healthy()
    environ = open(f"/proc/{sglang_server.proc.pid}/environ", "rb").read()
    assert b"PYTHONUNBUFFERED" in environ and SGLANG_CANARY.encode() not in environ


def test_startup_failure_raises_with_the_log(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    server = SGLangServer(tmp_path, startup_timeout_s=120)
    if server.python is None:
        components.unavailable("sglang", "SGLang is not installed")
    with pytest.raises(EngineError, match="exited with code"):
        server.start()
    assert not server.alive()


def test_a_stop_during_a_restart_spawns_nothing(tmp_path, monkeypatch):
    """The engine restarts a server in a worker thread; a close() (stop) landing mid-restart must not
    leave a freshly spawned server behind. A stand-in process (not SGLang) plays the server."""
    import sys

    (tmp_path / "config.json").write_text("{}")
    server = SGLangServer(tmp_path, port=1234, python=sys.executable, reap_with_owner=False)
    monkeypatch.setattr(server, "command", lambda: [sys.executable, "-c", "import time; time.sleep(60)"])
    server.start(wait=False)
    first = server.proc
    kill = server.kill

    def kill_then_stop():  # stop() arrives between the restart's kill and its spawn
        kill()
        monkeypatch.setattr(server, "kill", kill)
        server.stop(grace_s=1)

    monkeypatch.setattr(server, "kill", kill_then_stop)
    with pytest.raises(EngineError, match="stopped while restarting"):
        server.restart(wait=False)
    assert server.proc is first and not server.alive()
    server.start(wait=False)  # an explicit start after a stop still works
    assert server.alive() and server.proc is not first
    server.stop(grace_s=1)
    assert not server.alive()
