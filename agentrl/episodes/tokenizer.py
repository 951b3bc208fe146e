"""The tokenizer a job renders chats with: the model's, with ``model.chat_template`` and
``model.tool_prompt`` applied.

Owns :func:`load_chat_tokenizer` (a model directory -> its tokenizer, set up), :func:`prepare` (the
same on a loaded tokenizer: Ray rollout workers get the template's text from the driver),
:func:`template_text` (``model.chat_template``: a built-in name, ``BUILTIN``, or a jinja file) and
``ChatSetup`` (what was chosen, as the one line a job prints at start). A model without a chat
template and no ``model.chat_template`` is a ``ConfigError`` naming that field, before any episode.
Every job that renders chats loads its tokenizer here (``agentrl run``, ``rollout``, ``sft``,
``serve``, ``check-template``), so the episode manager, the proxy endpoint and the server render the
same way.

Does not: load weights, resolve ``model.path`` (``agentrl.models.hub``), or check the template's
prefix property (``agentrl.episodes.template_check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.common.bounded import BadText, decode
from agentrl.episodes.tool_prompt import ToolPrompt, apply_tool_prompt
from agentrl.errors import ConfigError

if TYPE_CHECKING:  # typing only: importing transformers is slow
    from transformers import PreTrainedTokenizerBase

#: model.chat_template names -> the template files shipped in agentrl/templates
BUILTIN = {"chatml": "chatml.jinja", "qwen2_5": "qwen2_5.jinja"}
#: the tokens a built-in template writes, which the tokenizer must hold as single tokens
_NEEDS = {"chatml": ("<|im_start|>", "<|im_end|>"), "qwen2_5": ("<|im_start|>", "<|im_end|>")}
_HINT = f"a built-in name ({', '.join(BUILTIN)}) or the path of a jinja file"


def template_text(value: str, what: str = "model.chat_template") -> str:
    """The jinja text ``model.chat_template`` names; ConfigError when it names nothing readable."""
    if value in BUILTIN:
        return resources.files("agentrl").joinpath(f"templates/{BUILTIN[value]}").read_text(encoding="utf-8")
    p = Path(value).expanduser()
    if not p.is_file():
        raise ConfigError(f"{what}: {value!r} is neither {_HINT} that exists")
    try:
        text = decode(p.read_bytes())
    except OSError as e:
        raise ConfigError(f"{what}: {p} cannot be read: {e.strerror or e}") from None
    except BadText as e:
        raise ConfigError(f"{what}: {p}: {e}") from None
    if not text.strip():
        raise ConfigError(f"{what}: {p} is empty")
    return text


@dataclass(frozen=True)
class ChatSetup:
    """Which chat template a job renders with (``template``: where it comes from) and how tools
    reach the model (``tools``)."""

    template: str
    tools: ToolPrompt

    def line(self) -> str:
        return f"chat: {self.template}; {self.tools.note}"


def _check_tokens(tokenizer, name: str) -> None:
    unk = getattr(tokenizer, "unk_token_id", None)
    vocab = tokenizer.get_vocab()
    missing = [t for t in _NEEDS.get(name, ()) if vocab.get(t, unk) in (None, unk)]
    if missing:
        raise ConfigError(
            f"model.chat_template: {name!r} writes {', '.join(missing)}, which this tokenizer does not have as "
            "tokens; use the model's own template or a jinja file written for its tokens"
        )


def prepare(
    tokenizer,
    chat_template: str | None = None,
    tool_prompt: str = "auto",
    *,
    name: str | None = None,
    model: str = "the model",
) -> ChatSetup:
    """Set ``tokenizer`` up for rendering: ``chat_template`` (jinja text, from ``template_text``; its
    config value is ``name``) replaces the model's own; then ``tool_prompt``. ConfigError when there is
    no template at all."""
    if chat_template is not None:
        if name in _NEEDS:
            _check_tokens(tokenizer, name)
        tokenizer.chat_template = chat_template
        source = f"model.chat_template {name!r}" if name else "model.chat_template"
    elif getattr(tokenizer, "chat_template", None):
        source = "the model's own template"
    else:
        raise ConfigError(
            f"model.chat_template: {model} has no chat template (its tokenizer files hold none), and agentrl "
            f"renders every conversation with one; set model.chat_template to {_HINT} "
            "(e.g. --set model.chat_template=chatml)"
        )
    return ChatSetup(source, apply_tool_prompt(tokenizer, tool_prompt))


def load_chat_tokenizer(
    model_dir: str | Path, chat_template: str | None = None, tool_prompt: str = "auto", model: str | None = None
) -> tuple[PreTrainedTokenizerBase, ChatSetup]:
    """``model_dir``'s tokenizer set up by ``prepare`` for ``model.chat_template`` (a config value:
    built-in name or jinja file, or None) and ``model.tool_prompt``; with what was chosen. ``model``
    names the model in messages (the user's ``model.path``; default ``model_dir``)."""
    from transformers import AutoTokenizer

    text = None if chat_template is None else template_text(chat_template)  # a bad value fails before loading
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return tokenizer, prepare(tokenizer, text, tool_prompt, name=chat_template, model=repr(model or str(model_dir)))
