"""The soak (bench/bench_soak.py) shortened to 300 episodes per backend, with its leak checks as
assertions: every episode ends trainable (hostile code is the program's failure, shown to the
model, never an infrastructure failure; one known, scoped exception: hostile code starving the docker
container's executor), every program kind gets a status it may have (or its deadline), and
afterwards no container, process, sandbox work dir or mount, or file descriptor of ours is left,
and RSS does not climb. The full 10k-episode count is the bench script's.

The docker case skips, with the reason, where no daemon or sandbox image answers.
"""

import json
import subprocess
import sys
from pathlib import Path

import components
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_soak  # noqa: E402

from agentrl.sandbox import docker_unavailable_reason  # noqa: E402

N = 300


def _soak_in_fresh_process(backend: str, tmp_path: Path) -> dict:
    """The soak's fd/process/RSS accounting is per process: run it in a fresh one, so threads other
    tests leave in this pytest process (Ray's gRPC clients, say) cannot open a socket mid-soak and
    count as its leak (seen once in CI)."""
    out = tmp_path / "soak.json"
    script = Path(bench_soak.__file__)
    p = subprocess.run(
        [
            sys.executable,
            str(script),
            "--episodes",
            str(N),
            "--backends",
            backend,
            "--concurrency",
            "16",
            "--sample-every",
            "25",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=script.parent.parent,
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return json.loads(out.read_text())["reports"][0]


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_soak_leaves_nothing_behind(backend, tmp_path):
    if backend == "docker":
        reason = docker_unavailable_reason()
        if reason is not None:
            components.unavailable("docker", f"docker backend unavailable: {reason}")
    r = _soak_in_fresh_process(backend, tmp_path)
    assert not r.get("skipped"), r.get("skipped")
    bench_soak._print(r)
    assert r["episodes"] == N
    # No infra failure, no deadline, with one known exception: on docker a hostile program (mostly
    # fork bombs: 36 of 97 in the 10k soak; also 6 memory/disk/busy-loop runs) can starve the
    # container's executor (pid 1) past the host deadline on a loaded machine; the container is
    # destroyed (nothing leaks) but the episode ends sandbox_error. Left visible, scoped to that.
    infra = [u for u in r["infra"] if not (backend == "docker" and "no answer from its executor" in u["detail"])]
    assert infra == [], infra
    assert set(r["outcomes"]) <= {"ok", "truncated_length", "sandbox_error"}, r["outcomes"]
    if r["outcomes"].get("sandbox_error"):
        print(f"KNOWN: {r['outcomes']['sandbox_error']} episodes ended sandbox_error (executor starved)")
    ran = set(r["by_kind"])
    assert ran == set(bench_soak.KINDS) - set(r["kinds_left_out"]), f"kinds that never ran: {ran}"
    wrong = [u for u in r["unexpected"] if u["outcome"] != "sandbox_error"]
    assert wrong == [], wrong  # every program got a status its kind may have
    assert r["leaks"]["diff"] == {}, r["leaks"]  # containers, sandbox-uid processes, our children, dirs, mounts
    assert r["leaked_containers"] == 0 and r["leaked_processes"] == 0
    assert r["leaked_fds"] == {}, r["leaked_fds"]
    rss = [s["rss_mb"] for s in r["samples"]]
    # bounded memory: the second half of the run stays within 64 MB of where the first sample was
    assert max(rss[len(rss) // 2 :]) - rss[0] < 64, rss
