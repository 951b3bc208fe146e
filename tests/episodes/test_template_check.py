"""check_template: passes real token-exact templates, fails ones that rewrite earlier turns."""

from __future__ import annotations

import pytest

from agentrl.episodes.template_check import check_template, render_report
from agentrl.warmstart.tiny_model import build_tokenizer

# ChatML like Qwen3: reasoning (<think>...</think>) is dropped from assistant turns that come
# before the last user message, so earlier text changes once the user speaks again.
THINK_STRIPPING_TEMPLATE = """
{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}
    {%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
    {%- if m.role == 'assistant' %}
        {%- set content = m.content %}
        {%- if loop.index0 < ns.last_user and '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
    {%- elif m.role == 'tool' %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

NO_TOOLS_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _check(report, name):
    return next((passed, detail) for n, passed, detail in report.checks if n == name)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(None)


def test_qwen25_template_passes(tok):
    report = check_template(tok)
    assert report.ok, render_report(report)
    names = [n for n, _, _ in report.checks]
    assert names == ["has_chat_template", "renders_tools", "stop_token", "prefix", "deltas", "tokenization"]
    assert "<|im_end|>" in _check(report, "stop_token")[1]


def test_think_stripping_template_fails_prefix_check(tok):
    tok2 = build_tokenizer(None, chat_template=THINK_STRIPPING_TEMPLATE)
    report = check_template(tok2)
    assert not report.ok
    passed, detail = _check(report, "prefix")
    assert not passed and "drops <think> reasoning" in detail and "assistant turn" in detail
    assert not _check(report, "deltas")[0]  # the per-turn deltas cannot reproduce its rendering either
    assert _check(report, "stop_token")[0] and _check(report, "renders_tools")[0]
    text = render_report(report)
    assert text.startswith("chat template: NOT OK") and "[FAIL] prefix:" in text


def test_missing_template(tok):
    bare = build_tokenizer(None)
    bare.chat_template = None
    report = check_template(bare)
    assert not report.ok and report.checks == [("has_chat_template", False, "tokenizer.chat_template is empty")]


def test_template_without_tool_support(tok):
    t = build_tokenizer(None, chat_template=NO_TOOLS_TEMPLATE)
    report = check_template(t)
    assert not report.ok and not _check(report, "renders_tools")[0]
    assert "not rendered" in _check(report, "renders_tools")[1]
    assert check_template(t, tools=[]).ok  # fine for a python_block env that declares no tools


def test_custom_tools_and_warning_for_non_eos_end_of_turn(tok):
    t = build_tokenizer(None)
    t.eos_token = "<|endoftext|>"  # turns still end with <|im_end|>
    tools = [
        {
            "type": "function",
            "function": {"name": "lookup", "description": "d", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    report = check_template(t, tools=tools)
    assert report.ok and "1 tool schema" in _check(report, "renders_tools")[1]
    assert any("not tokenizer.eos_token" in w for w in report.warnings)
    assert "warning:" in render_report(report)


def test_render_error_is_reported_not_raised():
    t = build_tokenizer(
        None,
        chat_template=NO_TOOLS_TEMPLATE.replace(
            "{%- for m in messages %}",
            "{%- for m in messages %}{%- if m.role == 'tool' %}{{ raise_exception('tool role unsupported') }}{%- endif %}",  # noqa: E501
        ),
    )
    report = check_template(t, tools=[])
    passed, detail = _check(report, "prefix")
    assert not report.ok and not passed and "tool role unsupported" in detail
