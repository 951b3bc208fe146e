"""The tokenizer a job renders with: model.chat_template (built-in or file), a missing template named."""

from __future__ import annotations

import pytest

from agentrl.episodes.chat import ChatRenderer
from agentrl.episodes.tokenizer import BUILTIN, load_chat_tokenizer, prepare, template_text
from agentrl.errors import ConfigError
from agentrl.warmstart.tiny_model import build_tokenizer


def test_builtin_templates_and_files(tmp_path):
    assert set(BUILTIN) == {"chatml", "qwen2_5"}
    assert "<|im_start|>" in template_text("chatml") and "tools" in template_text("qwen2_5")
    f = tmp_path / "mine.jinja"
    f.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert template_text(str(f)).startswith("{% for m")
    with pytest.raises(ConfigError, match=r"model.chat_template: 'chatm' is neither a built-in name \(chatml"):
        template_text("chatm")
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        template_text(str(tmp_path / "empty.jinja"))
    (tmp_path / "bin.jinja").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="bin.jinja"):
        template_text(str(tmp_path / "bin.jinja"))


def test_a_model_without_a_template_names_the_field():
    tok = build_tokenizer(None)
    tok.chat_template = None
    with pytest.raises(ConfigError) as e:
        prepare(tok, model="'/models/bare'")
    msg = str(e.value)
    assert msg.startswith("model.chat_template: '/models/bare' has no chat template") and "chatml" in msg
    setup = prepare(tok, template_text("chatml"), name="chatml")
    assert setup.template == "model.chat_template 'chatml'" and setup.tools.used == "agentrl"
    assert "chat: model.chat_template 'chatml'; tools reach the model through agentrl's tool block" in setup.line()
    r = ChatRenderer(tok, tools=None)
    assert tok.convert_ids_to_tokens(r.end_of_turn_id) == "<|im_end|>" and r.glue == "\n"


def test_chatml_needs_its_tokens():
    class NoChatML:  # a tokenizer whose vocabulary lacks <|im_start|> and <|im_end|>
        chat_template = None
        unk_token_id = 0

        def get_vocab(self):
            return {"<unk>": 0, "a": 1}

    with pytest.raises(ConfigError, match=r"'chatml' writes <\|im_start\|>, <\|im_end\|>"):
        prepare(NoChatML(), template_text("chatml"), name="chatml")


def test_load_chat_tokenizer_applies_both_fields(tiny_model_dir, tmp_path):
    tok, setup = load_chat_tokenizer(tiny_model_dir)
    assert setup.template == "the model's own template" and setup.tools.used == "template"
    tok, setup = load_chat_tokenizer(tiny_model_dir, "chatml", "auto")
    assert tok.chat_template.endswith(template_text("chatml")) and setup.tools.used == "agentrl"
    with pytest.raises(ConfigError, match="model.chat_template: 'nope.jinja'"):
        load_chat_tokenizer(tiny_model_dir, "nope.jinja")
