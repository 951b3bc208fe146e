"""How tool schemas reach the model: its chat template's own rendering, or agentrl's tool block.

Owns ``model.tool_prompt`` (``MODES``) and :func:`apply_tool_prompt`, which settles it on a tokenizer:

* ``template`` — the template is used as it is (a template that ignores ``tools`` then never shows
  the model its tools: said in the choice's note);
* ``agentrl`` — agentrl's tool block (``agentrl/templates/tool_prompt.jinja``) is put in front of the
  template: the tool schemas in the Hermes format (``<tools>`` JSON schemas ``</tools>``, calls as
  ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, what the ``hermes`` parser of
  ``agentrl.tools.calls`` reads) at the end of the system message, and the template gets no tools;
* ``auto`` (the default) — ``template`` when the template renders tools (:func:`renders_tools`), else
  ``agentrl``;
* ``none`` — the template gets no tools (the env's own prompt must describe them).

The block lives in the tokenizer's ``chat_template``, so every renderer of the job (the episode
manager's ``ChatRenderer``, the proxy endpoint, ``agentrl serve``, SFT chat data, ``check-template``)
uses the same choice, and the block is part of the prompt the token-exact deltas are computed
against (it is rendered once with the system message, never re-tokenized per turn). Checkpoints copy
the model's tokenizer files, not this in-memory template: ``agentrl serve`` of a run applies the
run's ``model.tool_prompt`` again.

Does not: parse tool calls (``agentrl.tools.calls``), choose the chat template itself
(``agentrl.episodes.tokenizer``), or check the prefix property (``agentrl.episodes.template_check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from agentrl.episodes.chat import render
from agentrl.errors import ConfigError, TemplateError

MODES = ("auto", "template", "agentrl", "none")
_START = "{#- agentrl tool prompt"
_END = "{#- end of agentrl tool prompt #}"
#: what ``none`` puts in front of the template: tools dropped, nothing else changed
_NONE = _START + " (model.tool_prompt: none): the template gets no tools -#}{%- set tools = none %}" + _END
#: a tool no template names by chance, to see whether a template renders the tools it is given
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "agentrl_probe_tool",
            "description": "Echo the text.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    }
]


def block_template() -> str:
    """agentrl's tool block, the jinja put in front of a template (package data)."""
    text = resources.files("agentrl").joinpath("templates/tool_prompt.jinja").read_text(encoding="utf-8")
    return text.rstrip()  # ends with the end marker: nothing of the template after it is trimmed


def strip(template: str) -> str:
    """``template`` without a tool prompt agentrl put in front of it (so choices never stack)."""
    if template.startswith(_START) and _END in template:
        return template.split(_END, 1)[1]
    return template


def wrap(template: str, mode: str) -> str:
    """``template`` with mode ``agentrl`` or ``none`` put in front of it (``template``: unchanged)."""
    base = strip(template)
    if mode == "agentrl":
        return block_template() + base
    if mode == "none":
        return _NONE + base
    return base


def renders_tools(tokenizer, tools: list[dict] | None = None, **template_kwargs) -> tuple[bool, str]:
    """Does the tokenizer's template show the model the ``tools`` it is given? (ok, detail)."""
    tools = PROBE_TOOLS if tools is None else tools
    msgs = [{"role": "system", "content": "You are a careful assistant."}, {"role": "user", "content": "Hi."}]
    plain = render(tokenizer, msgs, add_generation_prompt=True, **template_kwargs)
    try:
        text = render(tokenizer, msgs, tools=tools, add_generation_prompt=True, **template_kwargs)
    except TemplateError as e:
        return False, f"the template fails when given tools ({e})"
    missing = [t["function"]["name"] for t in tools if t["function"]["name"] not in text]
    if text == plain or missing:
        return False, "tool schemas are not rendered (missing: " + ", ".join(missing or ["all"]) + ")"
    return True, f"{len(tools)} tool schema(s) rendered"


@dataclass(frozen=True)
class ToolPrompt:
    """The settled choice: ``mode`` as asked, ``used`` (``template``, ``agentrl`` or ``none``) and a
    sentence saying which way tools reach the model and why."""

    mode: str
    used: str
    note: str


def _set(tokenizer, mode: str) -> None:
    tmpl = tokenizer.chat_template
    if isinstance(tmpl, dict):  # named templates (e.g. "default" and "tool_use"): each gets the same choice
        tokenizer.chat_template = {k: wrap(v, mode) for k, v in tmpl.items()}
    else:
        tokenizer.chat_template = wrap(tmpl, mode)


def apply_tool_prompt(tokenizer, mode: str = "auto") -> ToolPrompt:
    """Set ``tokenizer.chat_template`` for ``model.tool_prompt`` = ``mode``; return the choice made.
    The tokenizer must have a chat template (``agentrl.episodes.tokenizer`` sees to it)."""
    if mode not in MODES:
        raise ConfigError(f"model.tool_prompt: {mode!r} is not one of {list(MODES)}")
    _set(tokenizer, "template")  # back to the model's own, whatever was set before
    if mode == "none":
        _set(tokenizer, "none")
        return ToolPrompt(
            mode,
            "none",
            "tools are not shown to the model (model.tool_prompt=none): the env's prompt must describe them",
        )
    if mode == "agentrl":
        _set(tokenizer, "agentrl")
        return ToolPrompt(
            mode,
            "agentrl",
            "tools reach the model through agentrl's tool block (Hermes format, in "
            "the system message; model.tool_prompt=agentrl)",
        )
    ok, detail = renders_tools(tokenizer)
    if ok:
        return ToolPrompt(
            mode,
            "template",
            f"tools reach the model through its chat template's own tool rendering (model.tool_prompt={mode})",
        )
    if mode == "template":
        return ToolPrompt(
            mode,
            "template",
            f"the chat template ignores tools ({detail}) and model.tool_prompt="
            "template keeps it so: the model does not see its tools (auto or agentrl would add "
            "agentrl's tool block)",
        )
    _set(tokenizer, "agentrl")
    return ToolPrompt(
        mode,
        "agentrl",
        "tools reach the model through agentrl's tool block (Hermes format, in the "
        "system message), as its chat template ignores tools (model.tool_prompt=auto)",
    )
