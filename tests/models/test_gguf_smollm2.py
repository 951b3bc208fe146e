"""The real SmolLM2-135M-Instruct GGUF (98 MB, Q4_1; AGENTRL_SMOLLM2_GGUF names it): `agentrl check-template`
passes on it, with its ChatML template getting agentrl's tool block; a 32-turn tool episode's deltas are
token-exact with its real tokenizer; `agentrl run` takes one RL step on it. Converting it takes ~30 s on 2
cores the first time (cached in AGENTRL_CACHE after that), so these are marked slow."""

from __future__ import annotations

import os
import subprocess
import sys

import components
import pytest


@pytest.mark.slow
def test_check_template_passes_on_the_real_smollm2_gguf():
    path = components.smollm2_gguf()
    res = subprocess.run(
        [sys.executable, "-m", "agentrl", "check-template", "--model", path],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    assert "OK for token-exact multi-turn" in out and "[PASS] renders_tools" in out
    assert "agentrl's tool block" in out and "assistant turns end with '<|im_end|>'" in out


@pytest.mark.slow
def test_a_32_turn_tool_episode_is_token_exact_with_the_real_tokenizer():
    """Prompt ids, then per turn the sampled reply's ids (as an engine returns them, ending with
    <|im_end|>) and the observation's template delta: the whole decodes to the chat template's rendering
    of the conversation, character for character, after 32 turns of tool calls, tool output with
    non-ASCII text, and user nudges."""
    import json

    from agentrl.envs.registry import make
    from agentrl.episodes.chat import ChatRenderer
    from agentrl.episodes.tokenizer import load_chat_tokenizer
    from agentrl.warmstart import demos
    from agentrl.warmstart.default_model import resolve_model_path

    tok, setup = load_chat_tokenizer(resolve_model_path(components.smollm2_gguf()), None, "auto")
    assert setup.tools.used == "agentrl"
    env = make("code_exec", sandbox=demos.OracleSandbox())
    tools = env.toolset.schemas()
    env.close()
    r = ChatRenderer(tok, tools=tools)
    messages = [{"role": "system", "content": "Solve it with Python."}, {"role": "user", "content": "Sum 1..n ✓"}]
    ids = r.prompt_ids(messages)
    for t in range(32):
        call = {"name": "python", "arguments": {"code": f"print(sum(range({t})))  # «{t}»"}}
        reply = f"Step {t}: trying.\n<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
        obs = [{"role": "tool", "content": f"{sum(range(t))}\n→ done ✓ {'x' * (t % 5)}"}]
        if t % 4 == 3:
            obs.append({"role": "user", "content": f"Keep going ({t})."})
        ids += tok.encode(reply, add_special_tokens=False) + [r.end_of_turn_id]
        ids += r.observation_ids(obs)
        messages += [{"role": "assistant", "content": reply}, *obs]
    expected = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == expected
    assert expected.count("# Tools") == 1 and expected.count("<|im_start|>assistant") == 33


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_rl_step_of_the_real_smollm2_through_the_cli(tmp_path):
    """`agentrl run --model FILE` on code_exec: the GGUF resolves, the engine samples, the sandbox runs
    whatever the model calls, the trainer takes one GRPO step of the 135M model and checkpoints it, and
    a log (stderr is a pipe) gets the step's line. Small on purpose: 1 group of 4 short episodes."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentrl", "run", "--model", components.smollm2_gguf(), "--steps", "1", "-o", str(out)]
    for kv in (
        "rollout.group_size=4",
        "train.groups_per_step=1",
        "rollout.max_turns=2",
        "rollout.max_new_tokens=48",
        "rollout.max_context=1024",
        "trainer.micro_batch_tokens=1024",
        "trainer.lr=1e-5",
        "eval.num_tasks=0",
        "engine.max_batch_size=4",
    ):
        cmd += ["--set", kv]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=800, env={**os.environ, "COLUMNS": "200"})
    said = res.stdout + res.stderr
    assert res.returncode == 0, said[-3000:]
    assert "step 1/1  " in said and "(rollout wait" in said, said[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["rollout"]["infra_failures"] == 0, summary
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "train/tokens" in r]
    assert trained and trained[0]["train/tokens"] > 0 and trained[0]["train/version"] == 1.0, trained
    assert (out / "checkpoints" / "step_000001" / "COMPLETE").exists()
