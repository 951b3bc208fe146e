"""agentrl serve renders chats as the run it serves did: the run's model.chat_template / tool_prompt,
unless the serve command's config names them; the local backend then renders tools with that choice."""

from __future__ import annotations

import json

import httpx
import yaml

from agentrl.cli.serve import chat_settings
from agentrl.jobs.serve import LocalServer, resolve_target


def _run(tmp_path, model_dir, model: dict):
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_1"
    ckpt.mkdir(parents=True)
    (ckpt / "COMPLETE").write_text("")
    (ckpt / "trainer_state.json").write_text(json.dumps({"version": 1}))
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"path": str(model_dir), **model}}))
    return run, ckpt


def test_a_served_run_uses_its_chat_fields_unless_the_config_names_them(tmp_path, tiny_model_dir):
    run, ckpt = _run(tmp_path, tiny_model_dir, {"chat_template": "chatml", "tool_prompt": "none"})
    for path in (run, ckpt):
        t = resolve_target(path)
        assert (t.chat_template, t.tool_prompt) == ("chatml", "none")
    assert resolve_target(tiny_model_dir).tool_prompt == "auto"  # a plain model directory: the defaults
    assert chat_settings(None, ["model.tool_prompt=agentrl"]) == {"tool_prompt": "agentrl"}
    assert chat_settings(None, None) == {}


def test_local_server_renders_tools_with_the_targets_choice(tiny_model_dir):
    target = resolve_target(tiny_model_dir)
    target.chat_template, target.tool_prompt = "chatml", "auto"  # ChatML ignores tools: agentrl's block
    lines: list[str] = []
    tools = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]
    with LocalServer(target, port=0, name="tiny", log=lines.append) as server:
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 2},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        prompt = server.api.renderer.tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=tools, tokenize=False
        )
    assert any("agentrl's tool block" in ln for ln in lines)
    assert prompt.startswith("<|im_start|>system\n# Tools\n") and '"name": "python"' in prompt
