"""`agentrl serve`: PATH resolution, the local backend through the real `openai` client and through
litellm, bad requests, --follow on checkpoints written by the real trainer, and the SGLang backend
(skips, saying why, where SGLang cannot run). Unit tests of the response building use FakeEngine."""

from __future__ import annotations

import asyncio
import os
import random
import time

import components
import httpx
import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.jobs.serve import LocalServer, SGLangService, latest_checkpoint, resolve_target

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


# ------------------------------------------------------------------------------------- helpers
def train_and_save(model_dir, ckpt_dir, steps: int, seed: int = 0) -> int:
    """Train ``steps`` SFT steps from ``model_dir`` (a big lr: the weights must move visibly) and
    save a real trainer checkpoint at ``ckpt_dir``; returns its policy version."""
    from agentrl.trainer import Trainer, TrainerConfig, TrainSample

    rng = random.Random(seed)
    samples = []
    for _ in range(4):
        ids = [rng.randrange(5, 1000) for _ in range(12)]
        mask = [0] * 4 + [1] * 8
        samples.append(
            TrainSample(
                token_ids=ids, loss_mask=mask, behaviour_logprobs=[0.0] * 12, advantages=[float(m) for m in mask]
            )
        )
    with Trainer(str(model_dir), TrainerConfig(policy_loss="sft", lr=3e-2, micro_batch_tokens=64)) as t:
        for _ in range(steps):
            t.train_step(samples)
        t.save(ckpt_dir, extra={"step": steps})
        return t.version


def hf_logprobs(model_dir, prompt: list[int], completion: list[int]) -> list[float]:
    """Logprobs of ``completion`` after ``prompt`` from a plain HF forward pass of ``model_dir``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def wait_for_version(url: str, version: int, deadline_s: float = 180.0) -> dict:
    """Poll /v1/models until the served policy version is ``version`` (a hang guard, not a timing check)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        meta = httpx.get(f"{url}/v1/models").json()["data"][0]["agentrl"]
        if meta["policy_version"] == version:
            return meta
        time.sleep(0.2)
    raise AssertionError(f"the server never served policy version {version}; last: {meta}")


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    with LocalServer(resolve_target(tiny_model_dir), port=0, name="tiny") as server:
        yield server


# ------------------------------------------------------------------------------------- PATH
def test_bad_paths_are_named(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="nope.*does not exist"):
        resolve_target(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ConfigError, match="file.txt.*is a file"):
        resolve_target(tmp_path / "file.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty.*not an HF model directory"):
        resolve_target(tmp_path / "empty")
    half = tmp_path / "run" / "checkpoints" / "step_000001"
    half.mkdir(parents=True)
    with pytest.raises(ConfigError, match="step_000001.*incomplete"):
        resolve_target(half)
    with pytest.raises(ConfigError, match="run.*no complete checkpoint yet.*--follow"):
        resolve_target(tmp_path / "run")
    with pytest.raises(ConfigError, match="--follow needs a run directory"):
        resolve_target(tiny_model_dir, follow=True)


def test_cli_bad_path_exits_2_naming_it(tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    result = CliRunner().invoke(app, ["serve", str(tmp_path / "missing-model"), "--backend", "local"])
    assert result.exit_code == 2
    assert "missing-model" in result.output and "does not exist" in result.output
    result = CliRunner().invoke(app, ["serve", str(tmp_path), "--backend", "vllm"])
    assert result.exit_code == 2 and "vllm" in result.output


def test_run_dir_means_its_newest_complete_checkpoint(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    v1 = train_and_save(tiny_model_dir, run / "checkpoints" / "step_000001", steps=1)
    (run / "checkpoints" / "step_000002.tmp").mkdir()  # a save in progress is not a checkpoint
    target = resolve_target(run)
    assert target.model_dir == run / "checkpoints" / "step_000001" and target.version == v1 == 1
    assert latest_checkpoint(run) == target.checkpoint
    assert resolve_target(target.checkpoint).run_dir is None
    assert resolve_target(target.checkpoint, follow=True).run_dir == run


# ------------------------------------------------------------------------------------- clients
def test_openai_client_chat_and_completions(served):
    from openai import OpenAI

    client = OpenAI(base_url=f"{served.url}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["tiny"]

    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    chat = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, logprobs=True)
    choice = chat.choices[0]
    extra = choice.model_extra["agentrl"]
    assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
    assert chat.usage.completion_tokens == len(extra["token_ids"]) <= 8
    assert chat.usage.prompt_tokens == len(extra["prompt_token_ids"]) > 0
    assert [c.logprob for c in choice.logprobs.content] == extra["logprobs"]
    assert extra["policy_versions"] == [0]
    # greedy is reproducible, and the prompt is the model's own chat template
    again = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    assert again.choices[0].model_extra["agentrl"]["token_ids"] == extra["token_ids"]
    tok = served.api.tokenizer
    assert extra["prompt_token_ids"] == tok.encode(
        tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )

    comp = client.completions.create(model="tiny", prompt="The sum of", max_tokens=6, n=2, seed=3)
    assert len(comp.choices) == 2 and comp.usage.completion_tokens == sum(
        len(c.model_extra["agentrl"]["token_ids"]) for c in comp.choices
    )
    ids = comp.choices[0].model_extra["agentrl"]["token_ids"]
    assert comp.choices[0].text == tok.decode(
        [t for t in ids if t not in served.engine.eos_token_ids], skip_special_tokens=True
    )


def test_streaming_returns_the_same_completion(served):
    from openai import OpenAI

    client = OpenAI(base_url=f"{served.url}/v1", api_key="unused")
    msgs = [{"role": "user", "content": "Say something"}]
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_litellm_chat_and_text_completion(served):
    import litellm

    base = f"{served.url}/v1"
    resp = litellm.completion(
        model="openai/tiny",
        api_base=base,
        api_key="unused",
        max_tokens=7,
        temperature=0,
        messages=[{"role": "user", "content": "hello"}],
    )
    assert isinstance(resp.choices[0].message.content, str)
    assert 1 <= resp.usage.completion_tokens <= 7 and resp.usage.prompt_tokens > 0
    text = litellm.text_completion(model="openai/tiny", api_base=base, api_key="unused", prompt="print(", max_tokens=5)
    assert isinstance(text.choices[0].text, str) and 1 <= text.usage.completion_tokens <= 5
    with pytest.raises(litellm.exceptions.BadRequestError, match="temperature"):
        litellm.completion(
            model="openai/tiny",
            api_base=base,
            api_key="unused",
            temperature=7,
            messages=[{"role": "user", "content": "hello"}],
            num_retries=0,
        )


def test_bad_requests_get_4xx_with_a_message(served):
    import openai

    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError, match="'gpt-4' is not served here"):
        client.chat.completions.create(model="gpt-4", messages=msgs)
    with pytest.raises(openai.BadRequestError, match="temperature must be in"):
        client.chat.completions.create(model="tiny", messages=msgs, temperature=3)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="tiny", messages=msgs, logprobs=True, top_logprobs=3)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.chat.completions.create(model="tiny", messages=msgs, presence_penalty=1.0)
    with pytest.raises(openai.BadRequestError, match="messages must be a non-empty list"):
        client.chat.completions.create(model="tiny", messages=[])
    with pytest.raises(openai.BadRequestError, match="context is 4096 tokens"):
        client.completions.create(model="tiny", prompt=[5] * 5000, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match=r"token ids must be in \[0, "):
        client.completions.create(model="tiny", prompt=[1, 999999], max_tokens=2)
    r = httpx.post(f"{served.url}/v1/completions", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.get(f"{served.url}/v1/embeddings")
    assert r.status_code == 404 and "/v1/embeddings" in r.json()["error"]["message"]
    r = httpx.get(f"{served.url}/v1/chat/completions")
    assert r.status_code == 405
    # the server still answers after all that
    ok = client.completions.create(model="tiny", prompt="x", max_tokens=2)
    assert ok.usage.completion_tokens >= 1


# ------------------------------------------------------------------------------------- follow
def test_follow_swaps_in_new_checkpoints(tmp_path, tiny_model_dir):
    from openai import OpenAI

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"model:\n  path: {tiny_model_dir}\n")
    prompt = [1, 300, 400, 500, 600, 2]
    with LocalServer(resolve_target(run, follow=True), port=0, follow=True, poll_s=0.2, log=lambda m: None) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")

        def greedy():
            c = client.completions.create(model="run", prompt=prompt, max_tokens=6, temperature=0).choices[0]
            return c.model_extra["agentrl"]

        before = greedy()  # no checkpoint yet: the run's initial model
        assert before["policy_versions"] == [0]
        ref0 = hf_logprobs(tiny_model_dir, prompt, before["token_ids"])
        assert max(abs(a - b) for a, b in zip(before["logprobs"], ref0)) < 1e-3

        ckpt = run / "checkpoints" / "step_000003"
        version = train_and_save(tiny_model_dir, ckpt, steps=3)
        meta = wait_for_version(server.url, version)
        assert meta["checkpoint"] == "step_000003" and server.follower.swaps == 1
        after = greedy()
        assert after["policy_versions"] == [version]
        ref = hf_logprobs(ckpt, prompt, after["token_ids"])
        diff = max(abs(a - b) for a, b in zip(after["logprobs"], ref))
        assert diff < 1e-3, f"served logprobs differ from the checkpoint's by {diff}"
        moved = max(abs(a - b) for a, b in zip(hf_logprobs(tiny_model_dir, prompt, after["token_ids"]), ref))
        assert moved > 1e-2, "the checkpoint's weights did not change the logprobs: the test could not tell"


async def test_follower_ignores_incomplete_and_older_checkpoints(tmp_path, tiny_model_dir):
    from agentrl.jobs.serve import CheckpointFollower, ServeTarget

    run = tmp_path / "run"
    seen = []

    async def apply(ckpt, version):
        seen.append((ckpt.name, version))

    f = CheckpointFollower(ServeTarget(tiny_model_dir, run), apply, log=lambda m: None)
    assert await f.poll_once() is None
    (run / "checkpoints" / "step_000005").mkdir(parents=True)  # being written: no marker
    assert await f.poll_once() is None
    for name, version in (("step_000002", 2), ("step_000005", 5), ("step_000009.tmp", 9), ("step_000009.old", 8)):
        d = run / "checkpoints" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "trainer_state.json").write_text(f'{{"version": {version}}}')
        (d / "COMPLETE").write_text("ok\n")
    assert (await f.poll_once()).name == "step_000005"  # .tmp / .old carry a marker mid-save: skipped
    assert await f.poll_once() is None  # nothing newer
    d = run / "checkpoints" / "step_1000000"  # past the zero padding: compared as numbers
    d.mkdir()
    (d / "trainer_state.json").write_text('{"version": 10}')
    (d / "COMPLETE").write_text("ok\n")
    assert (await f.poll_once()).name == "step_1000000"
    assert seen == [("step_000005", 5), ("step_1000000", 10)]


# ------------------------------------------------------------------------------------- unit (fake engine)
async def test_tool_calls_and_stop_strings_unit_with_fake_engine(tiny_tokenizer):
    from agentrl.engine.fake import FakeEngine
    from agentrl.serving.api import OpenAIAPI

    reply = 'Let me run it. <tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call><|im_end|>'
    ids = tiny_tokenizer.encode(reply, add_special_tokens=False)
    api = OpenAIAPI(FakeEngine(lambda p, sp, ctx: ids), tiny_tokenizer, "fake")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "python",
                "description": "run code",
                "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
            },
        }
    ]
    out = await api.handle(
        "POST",
        "/v1/chat/completions",
        {"model": "fake", "tools": tools, "messages": [{"role": "user", "content": "go"}]},
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me run it."
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "python", "arguments": '{"code": "print(1)"}'}
    assert choice["agentrl"]["token_ids"] == ids and out["usage"]["completion_tokens"] == len(ids)
    out = await api.handle(
        "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "go"}], "stop": [" run"]}
    )
    assert out["choices"][0]["message"]["content"] == "Let me" and out["choices"][0]["finish_reason"] == "stop"


# ------------------------------------------------------------------------------------- sglang
@pytest.mark.sglang
async def test_sglang_backend_serves_v1_and_follows(tmp_path, sglang_model_dir):
    from openai import OpenAI

    from agentrl.engine.sglang.server import unavailable_reason

    reason = unavailable_reason()
    if reason:
        components.unavailable("sglang", reason)
    run = tmp_path / "run"
    train_and_save(sglang_model_dir, run / "checkpoints" / "step_000001", steps=1)
    service = SGLangService(resolve_target(run, follow=True), port=None, follow=True, poll_s=0.2, log=lambda m: None)
    try:
        service.start()  # a launcher error is agentrl's failure: the test fails with it
        client = OpenAI(base_url=f"{service.url}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["run"]
        chat = client.chat.completions.create(model="run", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert 1 <= chat.usage.completion_tokens <= 5
        assert httpx.get(f"{service.url}/model_info").json()["weight_version"] == "1"
        version = train_and_save(sglang_model_dir, run / "checkpoints" / "step_000004", steps=4)
        assert (await service.follower.poll_once()).name == "step_000004"
        assert httpx.get(f"{service.url}/model_info").json()["weight_version"] == str(version)
        comp = client.completions.create(model="run", prompt="The sum", max_tokens=4)
        assert 1 <= comp.usage.completion_tokens <= 4
        # a dead server is restarted on the newest weights it had been given
        service.server.kill()
        supervisor = asyncio.create_task(service.supervise(check_s=0.2))
        try:
            end = time.monotonic() + 300
            while time.monotonic() < end and not (service.server.restarts and service.server.healthy(timeout_s=2)):
                await asyncio.sleep(0.5)
        finally:
            supervisor.cancel()
        assert service.server.restarts == 1 and service.server.model_path == str(run / "checkpoints" / "step_000004")
        assert httpx.get(f"{service.url}/model_info").json()["weight_version"] == str(version)
    finally:
        service.stop()


def test_cli_serves_until_sigterm(tiny_model_dir):
    """The real command in a subprocess: it listens, answers, and exits cleanly on SIGTERM. ``--port 0``:
    it binds a port of the OS's choosing (one picked here could be taken before it bound it) and
    prints where it serves."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentrl.cli.main",
            "serve",
            str(tiny_model_dir),
            "--backend",
            "local",
            "--port",
            "0",
            "--name",
            "cli-tiny",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "400"},  # one line per message, the URL unbroken
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        found = None
        end = time.monotonic() + 180
        while found is None and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.2)
            found = re.search(r"serving cli-tiny .* at (http://127\.0\.0\.1:\d+)/v1", "".join(lines))
        assert found is not None and proc.poll() is None, "".join(lines)
        url = found.group(1)
        assert httpx.get(f"{url}/health").status_code == 200
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=60,
            json={"model": "cli-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        reader.join(timeout=10)
        assert "Traceback" not in "".join(lines), "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
