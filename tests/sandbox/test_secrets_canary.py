"""Must-show (issue 5): API keys planted in the environment appear in no log, trajectory, checkpoint,
config, metrics file or sandbox output.

Canary keys (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ``HF_TOKEN``) are planted, then: the LLM judge
runs against the live SGLang `/v1` endpoint (litellm sends the OpenAI canary there as the bearer
token) and against an endpoint that echoes a bad key back in its error; `agentrl eval` runs as a
subprocess (its stdout/stderr saved in the output dir) on a judged code_exec env whose policy calls
the python tool to print its environment; a shortened `agentrl run` trains, logs and checkpoints;
every sandbox backend available here runs programs that print their environment. Then no file under
the output dirs and no sandbox output holds a canary.
"""

import asyncio
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from scripted_openai import ScriptedOpenAI

DUMP_ENV = (
    "import os, sys\nprint(sorted(os.environ.items()))\n"
    "for p in ('/proc/self/environ', '/proc/1/environ', '/proc/' + str(os.getppid()) + '/environ'):\n"
    "    try:\n        print(p, open(p, 'rb').read())\n    except OSError as e:\n        print(p, 'unreadable', e)\n"
)


@pytest.fixture
def canaries(monkeypatch):
    keys = {
        "OPENAI_API_KEY": "sk-canary-" + secrets.token_hex(16),
        "ANTHROPIC_API_KEY": "sk-ant-canary-" + secrets.token_hex(16),
        "HF_TOKEN": "hf_canary" + secrets.token_hex(16),
    }
    for k, v in keys.items():
        monkeypatch.setenv(k, v)
    return keys


def _assert_clean(paths, canaries, what):
    scanned = 0
    for root in paths:
        for f in sorted(Path(root).rglob("*")):
            if f.is_file():
                data = f.read_bytes()
                scanned += 1
                for name, value in canaries.items():
                    assert value.encode() not in data, f"{name} canary leaked into {f}"
    return scanned


def test_the_scan_finds_a_planted_canary(tmp_path):
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "weights.bin").write_bytes(b"\x00\x01sk-canary-abc\x02")
    with pytest.raises(AssertionError, match="OPENAI_API_KEY canary leaked into .*weights.bin"):
        _assert_clean([tmp_path], {"OPENAI_API_KEY": "sk-canary-abc"}, "test")


@pytest.mark.sglang
def test_canary_keys_never_reach_files_or_the_sandbox(sglang_server, tiny_model_dir, tmp_path, canaries, capfd):
    from agentrl.envs.judge import JudgeReward
    from agentrl.errors import RewardError

    model = f"openai/{sglang_server.model_path}"
    v1 = sglang_server.url + "/v1"

    # 1. the judge: live endpoint (the OpenAI canary is its bearer token) -> RewardError without the key
    judge = JudgeReward(model, api_base=v1, max_tokens=8, max_retries=0, timeout_s=120)
    with pytest.raises(RewardError) as ei:
        asyncio.run(judge({"id": 1, "prompt": "2+2?", "answer": "4"}, "4", []))
    assert all(v not in str(ei.value) for v in canaries.values())
    # ... and a provider that echoes the bad key in its 401 (as real providers do): redacted
    with ScriptedOpenAI([(401, "Incorrect API key provided: {authorization}")]) as srv:
        with pytest.raises(RewardError, match="Incorrect API key") as ei:
            asyncio.run(
                JudgeReward("openai/judge", api_base=srv.url, api_key_env="OPENAI_API_KEY", max_retries=0)(
                    {"id": 1}, "a", []
                )
            )
    assert srv.requests[0]["authorization"] == f"Bearer {canaries['OPENAI_API_KEY']}"  # the key was really sent
    assert canaries["OPENAI_API_KEY"] not in str(ei.value) and "[redacted]" in str(ei.value)

    # 2. `agentrl eval` as a user runs it: judged code_exec; the policy prints the sandbox's environment
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    script = [{"content": "", "tool_calls": [("python", {"code": DUMP_ENV})]}, {"content": "\\boxed{1}"}]
    judge_cfg = json.dumps({"model": model, "api_base": v1, "max_tokens": 8, "max_retries": 0})
    with ScriptedOpenAI(script) as policy:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentrl.cli.main",
                "eval",
                "--env",
                "judged",
                "--env-arg",
                "env=code_exec",
                "--env-arg",
                f"judge={judge_cfg}",
                "--env-arg",
                "env_kwargs={sandbox_backend: local}",
                "--model",
                "openai/policy",
                "--api-base",
                policy.url,
                "-n",
                "2",
                "--concurrency",
                "1",
                "--out",
                str(eval_dir / "episodes.jsonl"),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ),
        )
    (eval_dir / "stdout.log").write_text(proc.stdout)
    (eval_dir / "stderr.log").write_text(proc.stderr)
    # every episode ends reward_error (the live judge answers garbage): an eval that measured nothing exits 2
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "every one of the 2 episodes ended reward_error" in proc.stderr, proc.stderr
    eps = [json.loads(line) for line in (eval_dir / "episodes.episodes.jsonl").read_text().splitlines()]
    assert len(eps) == 2
    tool_out = [m["content"] for e in eps for m in e["messages"] if m["role"] == "tool"]
    assert tool_out and all("/proc/self/environ" in t and "PATH" in t for t in tool_out)  # the dump really ran
    assert all(e["outcome"] == "reward_error" for e in eps)  # judged by the live endpoint: garbage

    # 3. a shortened `agentrl run` (train, metrics, TensorBoard, checkpoint, config.yaml)
    from short_run import short_run_cfg as _cfg

    from agentrl.jobs.run import Runner

    run_dir = tmp_path / "run"
    cfg = _cfg(
        tiny_model_dir,
        run_dir,
        2,
        [
            "eval.num_tasks=4",
            "eval.every=1",
            "train.checkpoint_every=1",
            "logging.tensorboard=true",
            "train.groups_per_step=2",
        ],
    )
    asyncio.run(Runner(cfg, progress=False).run())
    assert list((run_dir / "checkpoints").glob("step_*/COMPLETE")) and (run_dir / "config.yaml").exists()
    out, err = capfd.readouterr()
    (run_dir / "captured_output.log").write_text(out + err)

    # 4. every sandbox backend available here, directly
    from agentrl.sandbox import docker_unavailable_reason, shared_sandbox

    backends = ["local", "subprocess"] + ([] if docker_unavailable_reason() else ["docker"])
    sandbox_dir = tmp_path / "sandbox"
    sandbox_dir.mkdir()
    for backend in backends:
        res = asyncio.run(shared_sandbox(backend).run(["python3", "-c", DUMP_ENV], timeout_s=60))
        assert res.status == "ok" and "PATH" in res.stdout, (backend, res)
        (sandbox_dir / f"{backend}.out").write_text(res.stdout + res.stderr)
        res = asyncio.run(shared_sandbox(backend).run(["sh", "-c", "env; cat /proc/self/environ"], timeout_s=60))
        (sandbox_dir / f"{backend}-sh.out").write_text(res.stdout + res.stderr)

    scanned = _assert_clean([eval_dir, run_dir, sandbox_dir], canaries, "outputs")
    assert scanned >= 10, scanned
    print(f"canary scan: {scanned} files clean; sandbox backends checked: {backends}")
