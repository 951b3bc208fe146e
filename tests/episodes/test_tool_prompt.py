"""agentrl's tool block for templates that ignore tools: chosen by model.tool_prompt, token-exact, parseable."""

from __future__ import annotations

import json

import pytest

from agentrl.episodes.chat import ChatRenderer
from agentrl.episodes.template_check import check_template
from agentrl.episodes.tool_prompt import apply_tool_prompt, block_template, renders_tools, strip
from agentrl.errors import ConfigError
from agentrl.tools.calls import parse_hermes
from agentrl.warmstart.tiny_model import build_tokenizer

# SmolLM2-135M-Instruct's template (ChatML with a default system message, no tool support), public data
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code; returns its stdout.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web for 'q'.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    },
]


def _tok(template: str | None = SMOLLM2_TEMPLATE):
    return build_tokenizer(None, chat_template=template)


def _call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def test_auto_adds_the_block_only_where_the_template_ignores_tools():
    chatml = _tok()
    assert not renders_tools(chatml)[0]
    choice = apply_tool_prompt(chatml, "auto")
    assert choice.used == "agentrl" and "ignores tools" in choice.note and renders_tools(chatml)[0]
    qwen = _tok(None)  # Qwen2.5's template renders tools itself
    own = qwen.chat_template
    assert apply_tool_prompt(qwen, "auto").used == "template" and qwen.chat_template == own
    assert apply_tool_prompt(qwen, "agentrl").used == "agentrl" and qwen.chat_template != own


def test_template_and_none_and_bad_modes():
    tok = _tok()
    choice = apply_tool_prompt(tok, "template")
    assert choice.used == "template" and "does not see its tools" in choice.note
    assert tok.chat_template == SMOLLM2_TEMPLATE
    msgs = [{"role": "user", "content": "hi"}]
    qwen = _tok(None)
    apply_tool_prompt(qwen, "none")
    assert "python" not in qwen.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    with pytest.raises(ConfigError, match="model.tool_prompt: 'hermes' is not one of"):
        apply_tool_prompt(tok, "hermes")


def test_choices_never_stack_and_no_tools_renders_as_the_model_does():
    tok = _tok()
    apply_tool_prompt(tok, "agentrl")
    once = tok.chat_template
    apply_tool_prompt(tok, "auto")  # the wrapped template renders tools, but auto decides on the model's own
    assert tok.chat_template == once and strip(once) == SMOLLM2_TEMPLATE
    assert once == block_template() + SMOLLM2_TEMPLATE
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    plain = _tok()
    assert tok.apply_chat_template(msgs, tokenize=False) == plain.apply_chat_template(msgs, tokenize=False)


def test_the_block_in_the_system_message_and_its_example_parses():
    tok = _tok()
    apply_tool_prompt(tok, "auto")
    sys_msg = [{"role": "system", "content": "You solve tasks."}, {"role": "user", "content": "Go."}]
    text = tok.apply_chat_template(sys_msg, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou solve tasks.\n\n# Tools\n")
    assert "<tools>\n" + "\n".join(json.dumps(t) for t in TOOLS) + "\n</tools>" in system
    at = system.index("<tool_call>\n{")
    example = system[at : system.index("</tool_call>", at) + len("</tool_call>")]
    parsed = parse_hermes(example)
    assert not parsed.errors and parsed.calls[0].name == "function_name"
    # without a system message the block is the system message (the template's default one is replaced)
    text = tok.apply_chat_template(sys_msg[1:], tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\n# Tools\n") and "SmolLM" not in text
    assert text.count("<|im_start|>system") == 1


def test_structured_tool_calls_become_hermes_blocks():
    tok = _tok()
    apply_tool_prompt(tok, "agentrl")
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(1)"}'}},
        {"id": "c2", "type": "function", "function": {"name": "search", "arguments": {"q": "x"}}},
    ]
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "content": "1"},
    ]
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = parse_hermes(turn)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("python", {"code": "print(1)"}), ("search", {"q": "x"})]


def test_deltas_are_token_exact_with_the_block_over_many_turns():
    tok = _tok()
    apply_tool_prompt(tok, "auto")
    renderer = ChatRenderer(tok, tools=TOOLS)
    first = [{"role": "system", "content": "You solve tasks with tools."}, {"role": "user", "content": "Compute ✓"}]
    ids = renderer.prompt_ids(first)
    prompt_len = len(ids)
    messages = list(first)
    for t in range(12):
        text = f"Turn {t}.\n" + _call("python" if t % 2 else "search", {"code": f"print({t})"})
        obs = [{"role": "tool", "content": f"out {t}\n"}] + ([{"role": "user", "content": "More."}] if t % 3 else [])
        ids += tok.encode(text, add_special_tokens=False) + [renderer.end_of_turn_id]
        ids += renderer.observation_ids(obs)
        messages += [{"role": "assistant", "content": text}] + obs
    expected = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == expected
    # the block is in the prompt, rendered once: no delta carries it again
    assert "<tools>" in tok.decode(ids[:prompt_len]) and "<tools>" not in tok.decode(ids[prompt_len:])


def test_check_template_passes_with_the_block():
    tok = _tok()
    before = check_template(tok)
    assert not before.ok and not dict((n, p) for n, p, _ in before.checks)["renders_tools"]
    apply_tool_prompt(tok, "auto")
    report = check_template(tok)
    assert report.ok, report.checks
