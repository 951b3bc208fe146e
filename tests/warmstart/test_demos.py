"""Oracle demonstrations under any chat template and tool prompt, and the error a failed one raises."""

from __future__ import annotations

import asyncio

import pytest
from token_spans import mask_spans

from agentrl.episodes.chat import ChatRenderer
from agentrl.episodes.tokenizer import prepare
from agentrl.errors import DemonstrationError
from agentrl.sandbox.base import ExecResult
from agentrl.warmstart import demos
from agentrl.warmstart.tiny_model import build_tokenizer

pytestmark = pytest.mark.timeout(120)

# SmolLM2-135M-Instruct's template (ChatML, a default system message, no tool support): public data
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# no ChatML at all: text role headers, <|endoftext|> ends a turn, a tool message is a plain "### TOOL" block
HEADERS = (
    "{% for m in messages %}{{ '### ' + (m['role'] | upper) + '\\n' + m['content'] + '<|endoftext|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '### ASSISTANT\\n' }}{% endif %}"
)


def _tok(template: str | None, tool_prompt: str):
    tok = build_tokenizer()
    setup = prepare(tok, template, tool_prompt)
    return tok, setup.tools.used


@pytest.mark.parametrize(
    "template, tool_prompt, used",
    [
        (SMOLLM2, "auto", "agentrl"),
        (None, "auto", "template"),
        (None, "agentrl", "agentrl"),
        (HEADERS, "auto", "agentrl"),
    ],
    ids=["smollm2-auto", "qwen2.5-auto", "qwen2.5-agentrl", "headers-auto"],
)
def test_demonstrations_render_with_the_model_template_and_tool_prompt(template, tool_prompt, used):
    """Every demonstration succeeds whatever the template's markup, and is exactly what the rollout
    renders: the template's rendering of the conversation, with the tool prompt model.tool_prompt chose."""
    tok, chosen = _tok(template, tool_prompt)
    assert chosen == used
    todo = demos.demo_tasks(6, [1, 2, 3, 4], seed=1, direct_frac=0.3)
    run = asyncio.run(demos.run_demonstrations(tok, todo, env_kwargs={"sandbox": demos.OracleSandbox()}))
    assert run.failed == [] and len(run.good) == len(todo)
    r = ChatRenderer(tok, tools=_tools())
    end = tok.convert_ids_to_tokens(r.end_of_turn_id)
    assert end == ("<|endoftext|>" if template is HEADERS else "<|im_end|>")
    for task, traj in zip(todo, run.good):
        assert tok.decode(traj.token_ids) + r.glue == r.render(traj.messages)
        prompt = tok.decode(traj.token_ids[: traj.prompt_len])
        assert '"name": "python"' in prompt  # the model is shown its tool, one way or the other
        if used == "agentrl":
            assert "<tools>" in prompt and "<tool_call>" in prompt
        turns = [demos.oracle_turn(task, k, None, direct=bool(task.get("direct"))) for k in (0, 1)]
        want = turns[:1] if task.get("direct") else turns
        assert [tok.decode(s) for s in mask_spans(traj.token_ids, traj.loss_mask)] == [w + end for w in want]


def _tools():
    from agentrl.envs.registry import make

    env = make("code_exec", sandbox=demos.OracleSandbox())
    try:
        return env.toolset.schemas()
    finally:
        env.close()


class _Broken(demos.OracleSandbox):
    """Every program fails the way a broken interpreter would."""

    async def run(self, argv, *, stdin=None, timeout_s, files=None, **_):
        err = "Traceback (most recent call last):\n  ...\nImportError: libpython3.11.so: cannot open shared object"
        return ExecResult(stdout="", stderr=err, exit_code=1, status="ok", wall_s=0.0)


def test_failed_demonstrations_are_one_error_naming_the_first():
    tok, _ = _tok(SMOLLM2, "auto")
    with pytest.raises(DemonstrationError) as e:
        demos.demonstration_examples(tok, 5, difficulty=[2], env_kwargs={"sandbox": _Broken()}, sandbox="oracle")
    msg = str(e.value)
    first = demos.demo_tasks(5, [2])[0]
    assert msg.startswith("5 of 5 oracle demonstrations failed their checks (sft.demo_sandbox='oracle')")
    assert f"demonstration 0 (task {first['id']!r}, difficulty 2, with the python tool)" in msg
    assert "cannot open shared object" in msg and "[exit code 1]" in msg
    assert f"not the reference answer {first['answer']!r}" in msg


def test_python_block_demonstrations_and_a_turn_the_env_does_not_read_as_a_call():
    tok, _ = _tok(SMOLLM2, "auto")
    todo = demos.demo_tasks(2, [1])
    kw = {"sandbox": demos.OracleSandbox(), "parser": "python_block"}
    run = asyncio.run(demos.run_demonstrations(tok, todo, env_kwargs=kw))
    assert run.failed == []  # the oracle writes the parser's own format
    traj = run.good[0]
    traj.messages = traj.messages[:3]  # as if the env had read no call in turn 1
    why = demos.check_demonstration(traj, todo[0], "python_block")
    assert "the env's 'python_block' tool-call parser found no tool call" in why
