"""The default recipe, shortened, in every isolation mode a user's machine can be in.

``agentrl run --env code_exec --algo grpo`` on the built-in model at its full default concurrency
(32 groups x 8 episodes a step, 256 episodes in flight), a few steps and a small held-out eval,
with the local sandbox in each mode: bubblewrap; a new user's machine (root, bubblewrap not installed and
no Docker daemon: the README's first command exactly, the env's ``auto`` backend choosing ``local``); not root
(a user namespace mapping us to uid 1000, bubblewrap off: rlimits only). Each runs as a separate process,
as a user would start it (the trainer multi-threaded, the engine decoding while tools run), and
must end with 0 infrastructure failures and 0 tool timeouts in every rollout step and eval, and
say at start which isolation it has. (Correctness never depends on the optional layers.)

The new user's machine is made from this one: bubblewrap hidden in a private mount namespace (``/dev/null`` bound
over the ``bwrap`` binary, so it is not an executable on PATH) and ``DOCKER_HOST`` pointing at no daemon.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import components
import pytest

from agentrl.sandbox.local import bwrap_unavailable_reason

pytestmark = pytest.mark.slow

STEPS = 3
#: runs the rest of the command with bubblewrap hidden (a private mount namespace; needs root)
HIDE_BWRAP = ["unshare", "-m", "sh", "-c", 'b=$(command -v bwrap) && mount --bind /dev/null "$b"; exec "$@"', "sh"]
MODES = {
    # name: (command prefix, sandbox options (None: the recipe's own, backend auto), words the isolation line has)
    "bwrap": ([], {"bwrap": True}, ("read-only /usr view",)),
    "new-user": (
        HIDE_BWRAP,
        None,
        (
            "private pid, network and mount namespaces",
            "bwrap is not installed",
            "Docker (apt-get install docker.io; agentrl sandbox build) is the strongest backend",
        ),
    ),
    "not-root": (
        ["unshare", "--user", "--map-user=1000", "--map-group=1000"],
        {"bwrap": False},
        ("not root: programs run as you",),
    ),
}


def _skip_reason(mode: str) -> tuple[str, str] | None:
    """(component, why) when ``mode`` cannot be made on this machine, else None."""
    if mode == "bwrap":
        return bwrap_unavailable_reason() and ("bwrap", f"bubblewrap mode: {bwrap_unavailable_reason()}")
    if os.geteuid() != 0:
        return "root", f"{mode}: the test runs as uid {os.geteuid()}; it needs root to make the mode"
    if mode == "new-user" and shutil.which("unshare") is None:
        return "root", "new-user mode: util-linux unshare is missing"
    if mode == "not-root":
        if shutil.which("unshare") is None:
            return "root", "not-root mode: util-linux unshare is missing"
        probe = subprocess.run(MODES[mode][0] + ["true"], capture_output=True)
        if probe.returncode != 0:
            return "root", f"not-root mode: user namespaces unavailable ({probe.stderr.decode().strip()[:200]})"
    return None


@pytest.mark.parametrize("mode", list(MODES))
def test_shortened_default_recipe_has_no_infrastructure_failures(mode, tmp_path):
    reason = _skip_reason(mode)
    if reason:
        components.unavailable(*reason)
    prefix, options, words = MODES[mode]
    out = tmp_path / "run"
    sets = ["eval.num_tasks=64", "logging.tensorboard=false"]
    if options is not None:
        sets.append("env.kwargs=" + json.dumps({"sandbox_backend": "local", "sandbox_options": options}))
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"} if mode == "new-user" else None
    agentrl = [sys.executable, "-c", "from agentrl.cli.main import main; main()"]
    cmd = (
        prefix
        + agentrl
        + [
            "run",
            "--env",
            "code_exec",
            "--algo",
            "grpo",
            "--steps",
            str(STEPS),
            "-o",
            str(out),
        ]
        + [a for s in sets for a in ("--set", s)]
    )
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    printed = res.stdout + res.stderr
    line = next((ln for ln in printed.splitlines() if ln.startswith("sandbox: ")), None)
    assert line is not None and line.startswith("sandbox: local"), printed[-2000:]  # new-user: auto chose local
    missing = [w for w in words if w not in line]
    assert not missing, f"the isolation line lacks {missing}: {line}"

    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/episodes" in r]
    evals = [r for r in rows if "eval/episodes" in r]
    assert len(steps) == STEPS and len(evals) >= 2
    assert all(r["rollout/episodes"] >= 256 for r in steps)  # the full default batch, every step
    failures = {
        r["step"]: {k: v for k, v in r.items() if k.startswith(("rollout/outcome/", "eval/outcome/"))}
        for r in steps + evals
        if r.get("rollout/infra_failures", 0) or r.get("eval/infra_failures", 0)
    }
    assert failures == {}, f"infrastructure failures in {mode}: {failures}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollout"]["outcomes"].get("tool_timeout", 0) == 0
    assert summary["rollout"]["tool"].get("timeouts", 0) == 0
