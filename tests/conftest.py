import time

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The locally built byte-level BPE tokenizer carrying Qwen2.5's real chat template."""
    from agentrl.warmstart.tiny_model import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return build_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def sglang_model_dir(tmp_path_factory):
    """A tiny Qwen3 (head_dim 32, the built-in model's shape) for SGLang servers and their references."""
    from agentrl.warmstart.default_model import BASE
    from agentrl.warmstart.tiny_model import build_model

    return build_model(tmp_path_factory.mktemp("sglang-model"), **BASE)


def start_sglang_or_skip(model_dir, **kwargs):
    """Start an SGLang server on ``model_dir``, or skip the test saying why SGLang cannot run here."""
    from agentrl.engine.sglang_server import SGLangServer, unavailable_reason
    from agentrl.errors import EngineError

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = SGLangServer(model_dir, **kwargs)
    try:
        return server.start()
    except EngineError as e:
        server.kill()
        pytest.skip(f"SGLang could not start here: {e}")


@pytest.fixture(scope="session")
def sglang_server(sglang_model_dir):
    """One live SGLang server (started with the CPU flags pinned in agentrl.engine.sglang_server) shared by
    the session's tests. Tests that change its weights must restore them (or use their own server)."""
    server = start_sglang_or_skip(sglang_model_dir)
    yield server
    server.stop()


@pytest.fixture
def clean_registry():
    """Restore the env registry after a test that registers ids."""
    from agentrl.envs import registry

    saved, loaded, discovered = dict(registry._specs), dict(registry._loaded), registry._discovered
    yield
    registry._specs.clear()
    registry._specs.update(saved)
    registry._loaded.clear()
    registry._loaded.update(loaded)
    registry._discovered = discovered


#: A test whose setup, call or teardown takes this long is named as it ends, with the suite's elapsed time, so a
#: run that is stopped from outside (CI's time limit) still says where its time went.
SLOW_NOTE_S = 60.0
_suite = {"start": time.monotonic(), "reporter": None}


def pytest_sessionstart(session):
    _suite["reporter"] = session.config.pluginmanager.get_plugin("terminalreporter")


def pytest_runtest_logreport(report):
    reporter = _suite["reporter"]
    if report.duration >= SLOW_NOTE_S and reporter is not None:
        elapsed = (time.monotonic() - _suite["start"]) / 60
        reporter.write_line("")
        reporter.write_line(
            f"[slow] {report.nodeid} ({report.when}): {report.duration:.0f} s; suite at {elapsed:.1f} min"
        )
