"""The components a test may need that a machine may lack, and the one way a test skips for lack of one.

A test skips only when a component is not installed or not possible on this machine, never because agentrl's own
code failed (a launcher error, a failed connect, a failed image build fails the test). Every skip names its
component as a tag at the start of its reason, ``[docker] ...``: :func:`unavailable` does it for code,
:func:`reason` for ``skipif`` marks and ``importorskip``.

``AGENTRL_REQUIRE`` (comma-separated names from :data:`COMPONENTS`) names the components that must be
present. Where it is set, ``tests/conftest.py`` turns a skip of a required component, and any skip that names no
component, into a failure: CI sets it, so a broken install, build or launcher fails CI instead of hiding behind a
skip. On a laptop it is unset and such tests skip, printing the reason (``pytest -ra``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NoReturn

import pytest

#: name -> what it is (the names AGENTRL_REQUIRE and skip tags use)
COMPONENTS = {
    "docker": "a Docker daemon with the sandbox image (agentrl sandbox build)",
    "gvisor": "gVisor's runsc runtime registered with the Docker daemon and able to run here",
    "bwrap": "bubblewrap (bwrap) able to create namespaces here",
    "root": "running as root (dedicated sandbox uids, tmpfs work dirs, own pid namespaces)",
    "sglang": "SGLang in its own virtualenv (agentrl setup sglang)",
    "ray": "Ray (pip install 'agentrl[ray]')",
    "chromium": "a headless Chromium for report screenshots",
    "verifiers": "verifiers in its own virtualenv (.ci/install_verifiers.sh)",
    "smollm2": "the SmolLM2-135M-Instruct GGUF (AGENTRL_SMOLLM2_GGUF)",
    "installed": "agentrl pip-installed (its console script and distribution metadata)",
    "no-gpu": "a machine without a CUDA device (tests of the CPU fall-back)",
    "skyrl": "skyrl-gym (pip install 'agentrl[skyrl]'; in the test extra)",
    "py311": "Python 3.11 or newer",
    # not possible on a CPU: SGLang's deterministic inference refuses the CPU attention backend
    "sglang-deterministic": "SGLang with --enable-deterministic-inference (a GPU attention backend)",
}

_TAG = re.compile(r"^\[([a-z0-9-]+)\] ")


def parse(value: str) -> frozenset[str]:
    """The component names of an ``AGENTRL_REQUIRE`` value; an unknown name is an error naming it."""
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    unknown = names - set(COMPONENTS)
    if unknown:
        raise ValueError(f"AGENTRL_REQUIRE names unknown components {sorted(unknown)}; known: {sorted(COMPONENTS)}")
    return names


_REQUIRED = parse(os.environ.get("AGENTRL_REQUIRE", ""))  # read once: a test that edits os.environ changes nothing


def required() -> frozenset[str]:
    """The components ``AGENTRL_REQUIRE`` named when the suite started."""
    return _REQUIRED


def reason(component: str, why: str) -> str:
    """A skip reason tagged with its component, for ``skipif(..., reason=...)`` and ``importorskip``."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; known: {sorted(COMPONENTS)}")
    return f"[{component}] {why}"


def unavailable(component: str, why: str) -> NoReturn:
    """Skip the running test because ``component`` is missing here, or fail it where the component is required."""
    text = reason(component, why)
    if component in required():
        pytest.fail(f"{text} (required here by AGENTRL_REQUIRE)", pytrace=False)
    pytest.skip(text)


def tag_of(skip_reason: str) -> str | None:
    """The component a skip reason names (``[docker] ...`` -> ``docker``), or None."""
    m = _TAG.match(skip_reason.removeprefix("Skipped: "))
    return m.group(1) if m else None


# -- hooks (tests/conftest.py imports them) ----------------------------------------------------------------------
def pytest_report_header(config):
    need = required()
    return f"required components (AGENTRL_REQUIRE): {', '.join(sorted(need)) if need else 'none'}"


def _fail_forbidden_skip(report) -> None:
    """Where AGENTRL_REQUIRE is set, turn a skip of a required component, or one naming no component, into a
    failure that says so (``report`` is a test's or a module's report)."""
    need = required()
    if not (report.skipped and need) or hasattr(report, "wasxfail"):
        return
    why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    tag = tag_of(why)
    if tag is None or tag in need:
        report.outcome = "failed"
        what = f"requires {tag!r}" if tag else "names no component (tests/components.py)"
        report.longrepr = f"skipped, but AGENTRL_REQUIRE={','.join(sorted(need))} {what}: {why}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_forbidden_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield  # a module skipped as a whole (importorskip at import): its collection report
    _fail_forbidden_skip(outcome.get_result())


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF that AGENTRL_SMOLLM2_GGUF names (``bash .ci/fetch_smollm2.sh`` fetches it);
    the ``smollm2`` component is unavailable without it."""
    path = os.environ.get("AGENTRL_SMOLLM2_GGUF")
    if not path or not Path(path).is_file():
        unavailable(
            "smollm2",
            "AGENTRL_SMOLLM2_GGUF does not name the file (bash .ci/fetch_smollm2.sh)"
            + (f": {path!r} is not a file" if path else ": unset"),
        )
    return Path(path)
