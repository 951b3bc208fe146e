"""The trainer's Python prefix inside the local sandbox, wherever it lives (issue 31).

The local backend shows programs the trainer's interpreter read-only at its own path (``python3``
on PATH is the trainer's, with its packages: what the ``python`` tool and ``code_exec`` run). A
virtualenv under ``/tmp`` used to vanish behind the sandbox's private ``/tmp`` (``cannot start
'/tmp/venv/bin/python'``; ``python3`` silently fell back to the system's, without the packages);
these tests put a prefix there, with a space in its path, reachable by the sandbox uid or behind a
0700 directory, in each isolation mode the machine has.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import components
import pytest

from agentrl.sandbox.local import LocalSandbox

ROOT = os.geteuid() == 0
# mode -> (LocalSandbox kwargs, what the mode is, whether this sandbox is it)
MODES = {
    "bwrap_view": (
        {},
        "bwrap",
        "bubblewrap's view built by the executor (root + bwrap)",
        lambda sb: bool(sb.root_view),
    ),
    "namespaces": ({"bwrap": False}, "root", "private namespaces without bwrap (root)", lambda sb: sb.mounts.isolate),
    "bwrap_program": ({"uid_base": None}, "bwrap", "the bwrap program (bwrap)", lambda sb: bool(sb.bwrap)),
}


def _sandbox(mode: str) -> LocalSandbox:
    kwargs, component, what, is_it = MODES[mode]
    sb = LocalSandbox(**kwargs)
    if not is_it(sb):
        components.unavailable(component, f"{what} is not available here: {sb.isolation_summary()}")
    return sb


@pytest.fixture
def prefix_under_tmp(request, monkeypatch):
    """A stand-in prefix at ``/tmp/agentrl prefix XXXX/venv`` (its parent 0755 or 0700), made the
    trainer's ``sys.prefix``: ``bin/agentrl-probe`` prints ``lib/data.txt``."""
    top = Path(tempfile.mkdtemp(prefix="agentrl prefix ", dir="/tmp"))  # under /tmp on purpose: a scratch dir
    try:
        os.chmod(top, 0o755 if request.param == "open" else 0o700)
        prefix = top / "venv"
        (prefix / "bin").mkdir(parents=True)
        (prefix / "lib").mkdir()
        (prefix / "lib" / "data.txt").write_text("from the prefix\n")
        probe = prefix / "bin" / "agentrl-probe"
        probe.write_text('#!/bin/sh\ncat "$(dirname "$0")/../lib/data.txt"\n')
        probe.chmod(0o755)
        monkeypatch.setattr(sys, "prefix", str(prefix))
        monkeypatch.setattr(sys, "base_prefix", str(prefix))
        yield prefix
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("prefix_under_tmp", ["open", "0700_parent"], indirect=True)
@pytest.mark.parametrize("mode", sorted(MODES))
async def test_a_prefix_under_tmp_is_shown_read_only(prefix_under_tmp, mode):
    prefix = str(prefix_under_tmp)
    sb = _sandbox(mode)
    assert sb.describe()["python_prefixes"] == [prefix]
    for argv in ([f"{prefix}/bin/agentrl-probe"], ["agentrl-probe"]):  # by its path (spaces in it), from PATH
        r = await sb.run(argv, timeout_s=20)
        assert (r.status, r.stdout) == ("ok", "from the prefix\n"), r
    r = await sb.run(["sh", "-c", 'echo x > "$0/lib/pwned"', prefix], timeout_s=20)
    assert r.exit_code != 0 and not os.path.exists(f"{prefix}/lib/pwned"), r
    async with await sb.session() as s:  # a trainer-made work dir bound in, rather than the jail's own
        r = await s.run(["agentrl-probe"], timeout_s=20)
        assert r.stdout == "from the prefix\n", r


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_python3_is_the_trainers_interpreter_with_its_packages(mode):
    """Wherever this interpreter lives (CI: a virtualenv under /tmp): ``python3`` in the sandbox is it,
    cold (``-c``) and warm (``-``, the python tool's path), and so is its own path."""
    sb = _sandbox(mode)
    code = "import sys, yaml; print(sys.prefix)"  # pyyaml: a dependency of agentrl, so in the trainer's prefix
    for argv, stdin in (
        (["python3", "-c", code], None),
        (["python3", "-"], code.encode()),
        ([sys.executable, "-c", code], None),
    ):
        r = await sb.run(argv, stdin=stdin, timeout_s=30)
        assert (r.status, r.exit_code, r.stdout.strip()) == ("ok", 0, sys.prefix), (argv, r)
