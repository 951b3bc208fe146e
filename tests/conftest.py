import importlib.util
import json
import os
import time
from pathlib import Path

import components
import pytest
from components import pytest_make_collect_report, pytest_report_header, pytest_runtest_makereport  # noqa: F401

#: verifiers 0.4 pins mcp==2.0.0, which litellm[mcp] here refuses: its tests run inside verifiers' own virtualenv
#: (tests/agents/test_verifiers_venv.py), and are collected in this one only where verifiers is importable
collect_ignore = [] if importlib.util.find_spec("verifiers") else ["agents/test_verifiers.py"]


#: Tests that must share one xdist worker (README's test command runs 2, ``--dist loadgroup``): one SGLang server
#: per session serves every sglang test; Ray tests count every Ray process on the machine; the sandbox tests count
#: host processes, mounts and containers. A group is dispatched before single tests, so the long ones start first.
XDIST_GROUPS = (("ray", "ray"), ("sglang", "sglang"), ("docker", "sandbox"))


def _xdist_group(item) -> str | None:
    if "sglang_server" in getattr(item, "fixturenames", ()):  # the worker's session server: start it once
        return "sglang"
    for marker, group in XDIST_GROUPS:
        if item.get_closest_marker(marker) is not None:
            return group
    return "sandbox" if "/tests/sandbox/" in str(item.path) else None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    grouped = []
    for item in items:
        if "sglang_server" in getattr(item, "fixturenames", ()) and item.get_closest_marker("sglang") is None:
            item.add_marker(pytest.mark.sglang)  # -m sglang selects every test that needs the server
        group = _xdist_group(item)
        if group in ("sglang", "ray"):  # a server or a cluster to start: never part of the inner loop
            item.add_marker(pytest.mark.slow)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            grouped.append(item)
    rank = {name: i for i, (_, name) in enumerate(XDIST_GROUPS)}
    # stable: a group keeps its collection order, but for tests marked first_in_group
    grouped.sort(key=lambda it: (rank[_xdist_group(it)], it.get_closest_marker("first_in_group") is None))
    ids = {id(it) for it in grouped}
    items[:] = grouped + [it for it in items if id(it) not in ids]


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


def sglang_or_skip() -> None:
    """Skip (or fail, where AGENTRL_REQUIRE names sglang) when SGLang is not installed here."""
    from agentrl.engine.sglang.server import unavailable_reason

    reason = unavailable_reason()
    if reason:
        components.unavailable("sglang", reason)


def start_sglang_or_skip(model_dir, **kwargs):
    """Start an SGLang server on ``model_dir``; skip only when SGLang is not installed. A start that fails is
    agentrl's launcher failing (its flags, its supervision): the test fails with the launcher's error."""
    from agentrl.engine.sglang.server import SGLangServer

    sglang_or_skip()
    server = SGLangServer(model_dir, **kwargs)
    try:
        return server.start()
    except BaseException:
        server.kill()
        raise


#: an API key in the environment of the session server's launch (tests/engine/test_sglang_server.py checks it
#: never reaches the server)
SGLANG_CANARY = "sk-canary-" + "7" * 24


@pytest.fixture(scope="session")
def sglang_server(sglang_model_dir):
    """One live SGLang server (started with the CPU flags pinned in agentrl.engine.sglang.server) shared by
    the session's tests. Tests that change its weights must restore them (or use their own server)."""
    from unittest import mock

    with mock.patch.dict(os.environ, {"OPENAI_API_KEY": SGLANG_CANARY}):  # must not reach the server's environment
        server = start_sglang_or_skip(sglang_model_dir)
    yield server
    server.stop()


def _sglang_generate_meta(url: str) -> dict:
    import httpx

    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0}, "return_logprob": True}
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["meta_info"]


@pytest.fixture
def sglang_server_restored(sglang_server, sglang_model_dir):
    """The session's SGLang server for a test that changes its weights: afterwards its own weights and weight
    version are loaded back, and checked (the same logprobs as before the test), so later tests see it as it
    started. A test that must kill or reconfigure a server starts its own instead."""
    import httpx

    before = _sglang_generate_meta(sglang_server.url)
    yield sglang_server
    body = {"model_path": str(sglang_model_dir), "weight_version": before["weight_version"], "flush_cache": True}
    r = httpx.post(f"{sglang_server.url}/update_weights_from_disk", json=body, timeout=300)
    assert r.status_code == 200 and r.json().get("success", True), f"restoring the session server: {r.text[:300]}"
    after = _sglang_generate_meta(sglang_server.url)
    assert after["weight_version"] == before["weight_version"]
    lp = lambda m: m["output_token_logprobs"][0][0]  # (logprob, token id, text)
    assert abs(lp(after) - lp(before)) < 1e-4, "the session server's weights were not restored"


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


#: AGENTRL_SUITE_TIMES=FILE: every test phase's duration, outcome, worker and tier markers are written there as JSON
#: when the run ends (``python tools/suite_time.py FILE`` prints where the time went; .ci/run does)
TIMES_ENV = "AGENTRL_SUITE_TIMES"
TIER_MARKERS = ("slow", "docker", "sglang", "ray")
_phases: list[dict] = []


def _record_phase(report) -> None:
    node = getattr(report, "node", None)  # xdist's controller: the worker that ran it
    _phases.append(
        {
            "test": report.nodeid,
            "when": report.when,
            "s": round(report.duration, 3),
            "outcome": report.outcome,
            "worker": getattr(getattr(node, "gateway", None), "id", "main"),
            "marks": [m for m in TIER_MARKERS if m in report.keywords],
        }
    )


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(TIMES_ENV)
    if path and not hasattr(session.config, "workerinput"):  # the controller, or a run without workers
        wall = time.monotonic() - _suite["start"]
        Path(path).write_text(json.dumps({"wall_s": round(wall, 1), "exit": int(exitstatus), "phases": _phases}))


def pytest_runtest_logreport(report):
    if os.environ.get(TIMES_ENV):
        _record_phase(report)
    reporter = _suite["reporter"]
    if report.duration >= SLOW_NOTE_S and reporter is not None:
        elapsed = (time.monotonic() - _suite["start"]) / 60
        reporter.write_line("")
        reporter.write_line(
            f"[slow] {report.nodeid} ({report.when}): {report.duration:.0f} s; suite at {elapsed:.1f} min"
        )
