"""ChatRenderer: token-exact deltas reproduce the template's own rendering, turn after turn."""

from __future__ import annotations

import json
import random

import pytest

from agentrl.episodes.chat import ChatRenderer
from agentrl.errors import TemplateError
from agentrl.tools.calls import parse_hermes
from agentrl.warmstart.tiny_model import build_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    },
]

# A Llama-3.1-style template (header tokens, <|eot_id|> with no glue after it, tools in the system
# turn, tool results as the "ipython" role, content trimmed), carried as test data.
LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "You are a helpful assistant." %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools %}
    {{- "You have access to the following functions:\\n\\n" }}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
{%- endif %}
{{- system_message + "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role in ['tool', 'ipython'] %}{%- set role = 'ipython' %}{%- else %}{%- set role = message.role %}{%- endif %}
    {{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""


@pytest.fixture(scope="module")
def qwen_tok():
    return build_tokenizer(None)


@pytest.fixture(scope="module")
def llama_tok():
    tok = build_tokenizer(None, chat_template=LLAMA3_TEMPLATE)
    tok.add_tokens(["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], special_tokens=True)
    tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    return tok


def _call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _conversation(seed: int, turns: int) -> tuple[list[dict], list[tuple[str, list[dict]]]]:
    """Initial messages and, per turn, (assistant text, the messages that follow it)."""
    rng = random.Random(seed)
    first = [
        {"role": "system", "content": "You solve tasks with tools."},
        {"role": "user", "content": "Compute things for me, step by step. ünïcødé ✓"},
    ]
    steps = []
    for t in range(turns):
        kind = t % 4
        n_calls = 1 if kind == 0 else rng.randint(2, 3) if kind == 1 else rng.randint(1, 2)
        calls = [
            _call(rng.choice(["python", "search"]), {"code": f"print({t} * {k})\n# tab\there"}) for k in range(n_calls)
        ]
        text = f"Turn {t}: I will call {n_calls} tool(s).\n" + "\n".join(calls)
        if kind == 3:
            text = f"Partial answer {t}: 42 with no tool call."
            obs = [{"role": "user", "content": f"Follow-up question {t}? Please continue."}]
        else:
            obs = [{"role": "tool", "content": f'out {t}.{k}\n{{"json": [1, 2]}}  <b>x</b>'} for k in range(n_calls)]
            if kind == 2:  # tool results followed by a user nudge in the same observation
                obs.append({"role": "user", "content": "Also, hurry up."})
        steps.append((text, obs))
    return first, steps


def _rollout(renderer: ChatRenderer, tok, first, steps):
    ids = renderer.prompt_ids(first)
    messages = list(first)
    for text, obs in steps:
        ids += tok.encode(text, add_special_tokens=False) + [renderer.stop_token_ids[0]]  # as if sampled
        ids += renderer.observation_ids(obs)
        messages += [{"role": "assistant", "content": text}] + obs
    return ids, messages


@pytest.mark.parametrize("which", ["qwen", "llama"])
def test_golden_property_over_many_turns(which, qwen_tok, llama_tok):
    tok = qwen_tok if which == "qwen" else llama_tok
    renderer = ChatRenderer(tok, tools=TOOLS)
    first, steps = _conversation(seed=1, turns=32)
    ids, messages = _rollout(renderer, tok, first, steps)
    expected = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    got = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert got == expected
    assert len(steps) >= 30 and sum(m["role"] == "tool" for m in messages) > 30


def test_stop_tokens_and_glue(qwen_tok, llama_tok):
    q = ChatRenderer(qwen_tok)
    assert q.stop_token_ids == (qwen_tok.convert_tokens_to_ids("<|im_end|>"),) and q.glue == "\n"
    ll = ChatRenderer(llama_tok)
    assert ll.stop_token_ids[0] == llama_tok.convert_tokens_to_ids("<|eot_id|>") and ll.glue == ""


def test_prompt_ids_match_template_tokenization(qwen_tok):
    msgs = [{"role": "user", "content": "hello"}]
    r = ChatRenderer(qwen_tok, tools=TOOLS)
    ref = qwen_tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert r.prompt_ids(msgs) == list(ref)
    text = qwen_tok.decode(r.prompt_ids(msgs), skip_special_tokens=False)
    assert '"name": "search"' in text and text.endswith("<|im_start|>assistant\n")


def test_observation_ids_do_not_render_history(qwen_tok):
    r = ChatRenderer(qwen_tok, tools=TOOLS)
    seen: list[int] = []
    original = r.render
    r.render = lambda messages, add_generation_prompt=False: (
        seen.append(len(messages)),
        original(messages, add_generation_prompt),
    )[1]
    first, steps = _conversation(seed=2, turns=12)
    _rollout(r, qwen_tok, first, steps)
    assert max(seen) <= 2 + max(len(obs) for _, obs in steps)  # dummy pair + the new messages only


def test_observation_cache_is_not_poisoned(qwen_tok):
    r = ChatRenderer(qwen_tok)
    obs = [{"role": "tool", "content": "7"}]
    a = r.observation_ids(obs)
    a.append(-1)
    assert r.observation_ids(obs) == a[:-1]
    assert qwen_tok.decode(a[:-1], skip_special_tokens=False) == (
        "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_decode_keeps_tool_tags_and_drops_stop(qwen_tok):
    r = ChatRenderer(qwen_tok, tools=TOOLS)
    text = "Let me run it.\n" + _call("python", {"code": "print(1 + 1)"})
    ids = qwen_tok.encode(text, add_special_tokens=False) + list(r.stop_token_ids[:1])
    assert r.decode(ids) == text
    parsed = parse_hermes(r.decode(ids))
    assert parsed.calls[0].arguments == {"code": "print(1 + 1)"} and parsed.content == "Let me run it."


def test_close_ids(qwen_tok):
    r = ChatRenderer(qwen_tok)
    eot = r.end_of_turn_id
    assert r.close_ids([5, 6, eot]) == [] and r.close_ids([5, 6]) == [eot] and r.close_ids([]) == [eot]


def test_template_without_prefix_property_raises(qwen_tok):
    # Rewrites an assistant message once something follows it -> deltas would be wrong.
    tmpl = (
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
        "{%- if m.role == 'assistant' and not loop.last %}{{- ' (earlier)' }}{%- endif %}{{- '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    tok = build_tokenizer(None, chat_template=tmpl)
    with pytest.raises(TemplateError, match="prefix property"):
        ChatRenderer(tok).observation_ids([{"role": "tool", "content": "x"}])


def test_template_with_text_before_stop_token_raises():
    tmpl = (
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '\\n<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    tok = build_tokenizer(None, chat_template=tmpl)
    r = ChatRenderer(tok)
    assert r.end_of_turn_id is None and r.stop_token_ids == (tok.eos_token_id,)
    with pytest.raises(TemplateError, match="special token right after its content"):
        r.observation_ids([{"role": "user", "content": "x"}])


def test_render_error_is_template_error(qwen_tok):
    tmpl = "{{ raise_exception('no tool role here') if messages[-1].role == 'tool' else 'ok' }}"
    tok = build_tokenizer(None, chat_template=tmpl)
    with pytest.raises(TemplateError, match="no tool role here"):
        ChatRenderer(tok).render([{"role": "tool", "content": "x"}])
