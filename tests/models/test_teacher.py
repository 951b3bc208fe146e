"""The distillation teacher's reference resolved and its tokenizer checked against the student's:
same tokenizer passes; other ids for a token, another vocabulary size, or the same vocabulary with
other merges is a ConfigError naming both models; a URL (an SGLang teacher) is refused clearly."""

import json
import shutil

import pytest

from agentrl.errors import ConfigError
from agentrl.models.teacher import resolve_teacher


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return build_model(tmp_path_factory.mktemp("student"), hidden_size=32, num_layers=1)


def _copy_with_tokenizer(student, tmp_path, edit):
    """A copy of the student whose tokenizer.json is changed by ``edit(dict)``."""
    out = tmp_path / "teacher"
    shutil.copytree(student, out)
    tok = json.loads((out / "tokenizer.json").read_text())
    edit(tok)
    (out / "tokenizer.json").write_text(json.dumps(tok))
    return out


def test_a_teacher_with_the_same_tokenizer_resolves(student, tmp_path):
    teacher = tmp_path / "copy"
    shutil.copytree(student, teacher)
    assert resolve_teacher(str(teacher), student, "my-student") == teacher


def _swap_two_ids(tok):
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _drop_a_merge(tok):
    del tok["model"]["merges"][2]  # 'Ġ' + 'a': the vocabulary is unchanged, " a..." tokenizes otherwise


def _add_a_token(tok):
    tok["added_tokens"].append(
        {
            "id": max(t["id"] for t in tok["added_tokens"]) + 1,
            "content": "<|extra|>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )


@pytest.mark.parametrize(
    "edit, why",
    [
        (_swap_two_ids, r"token .* is id \d+ in the student's vocabulary and \d+ in the teacher's"),
        (_drop_a_merge, r"the probe text .* encodes to"),
        (_add_a_token, r"vocabulary sizes differ \(\d+ tokens in the student's, \d+ in the teacher's\)"),
    ],
)
def test_a_teacher_with_another_tokenizer_is_a_config_error_naming_both(student, tmp_path, edit, why):
    teacher = _copy_with_tokenizer(student, tmp_path, edit)
    named = rf"algo.teacher: '{teacher}' does not share the tokenizer of the student 'my-student': {why}"
    with pytest.raises(ConfigError, match=named):
        resolve_teacher(str(teacher), student, "my-student")


def test_a_url_teacher_is_refused_and_a_missing_one_named(student, tmp_path):
    with pytest.raises(ConfigError, match="a teacher served by SGLang is not supported"):
        resolve_teacher("http://127.0.0.1:30000", student, "s")
    with pytest.raises(ConfigError, match="algo.teacher: .*nope.gguf.* does not exist"):
        resolve_teacher(str(tmp_path / "nope.gguf"), student, "s")
