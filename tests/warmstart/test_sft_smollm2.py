"""The warm start of a real pretrained model: SmolLM2-135M-Instruct's GGUF (AGENTRL_SMOLLM2_GGUF names it).

Proves the path, not the learning: `agentrl sft --model FILE` makes and checks a few oracle demonstrations
rendered with the model's own ChatML template and agentrl's tool block, takes one SFT step and writes a model
whose tokenizer renders as it was trained. Marked slow: the first use converts the 98 MB file (~30 s on 2 cores)
and a step of a 135M model on CPU takes seconds."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import components
import pytest


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sft_of_the_real_smollm2_takes_a_step_on_checked_demonstrations(tmp_path):
    from transformers import AutoTokenizer

    from agentrl.envs.registry import make
    from agentrl.episodes.chat import ChatRenderer
    from agentrl.episodes.tokenizer import load_chat_tokenizer
    from agentrl.warmstart import demos
    from agentrl.warmstart.default_model import resolve_model_path

    gguf, out = components.smollm2_gguf(), tmp_path / "out"
    cmd = [sys.executable, "-m", "agentrl", "sft", "--model", gguf, "--steps", "1", "-o", str(out)]
    cmd += ["--set", "sft.batch_size=2", "--set", "sft.num_demos=2", "--set", "sft.micro_batch_tokens=1024"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=800, env={**os.environ, "COLUMNS": "200"})
    said = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, said
    assert "sft.lr=5e-05" in said and "(the recipe for a pretrained model" in said
    assert "agentrl's tool block" in said and "2 oracle demonstrations made and checked" in said
    assert "sft, step 1/1, loss" in said  # stderr is a pipe: progress comes as lines
    model_dir = resolve_model_path(gguf)  # converted by the command: cached now
    assert (
        AutoTokenizer.from_pretrained(str(out)).chat_template
        == AutoTokenizer.from_pretrained(str(model_dir)).chat_template
    )  # a rollout of the output renders as the demonstrations were rendered

    tok, setup = load_chat_tokenizer(model_dir, None, "auto")
    assert setup.tools.used == "agentrl"
    todo = demos.demo_tasks(4, [1, 2, 3, 4])
    run = asyncio.run(demos.run_demonstrations(tok, todo, env_kwargs={"sandbox": demos.OracleSandbox()}))
    assert run.failed == []
    env = make("code_exec", sandbox=demos.OracleSandbox())
    r = ChatRenderer(tok, tools=env.toolset.schemas())
    env.close()
    for traj in run.good:  # token-exact with the template the rollout renders
        assert tok.decode(traj.token_ids) + r.glue == r.render(traj.messages)
        ends = [i for i, (m, n) in enumerate(zip(traj.loss_mask, traj.loss_mask[1:] + [0])) if m and not n]
        assert ends and all(traj.token_ids[i] == r.end_of_turn_id for i in ends)  # each turn ends as sampled
