"""The on-policy distillation teacher: a model reference -> a local HF directory that shares the
student's tokenizer.

Owns :func:`resolve_teacher` (``algo.teacher`` resolved like ``model.path``: a local HF directory,
a GGUF file converted once, or a Hub id fetched, by ``agentrl.models.hub.resolve_model``; then the
tokenizer check) and :func:`tokenizer_mismatch`, the check itself. The teacher scores the token ids
the student sampled, so both must map every text to the same ids: the check compares the two
vocabularies (every token string and its id, added tokens included) and the ids of a fixed set of
probe texts (prose, code, JSON tool calls, whitespace, non-ASCII, chat markup), which also catches
two tokenizers with the same vocabulary but different merges. A mismatch is a ``ConfigError`` that
names both models and the first difference.

Does not: load the teacher's weights (the trainer does), or serve it (an SGLang-served teacher that
returns prompt logprobs is not built: the teacher always runs in the trainer process).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.models.hub import resolve_model

#: Texts both tokenizers must encode to the same ids.
PROBES = (
    "The quick brown fox jumps over the lazy dog. 17 x 23 = 391.",
    "def solve(xs):\n    return sorted(set(xs))[-2]\n\n\tprint(solve([3, 1, 4, 1, 5]))",
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 ** 10)"}}\n</tool_call>',
    "  leading spaces,\ttabs,\r\nCRLF and trailing   ",
    "naïve café, Straße, 東京, Привет, 🙂 — “quotes”",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
)


def _load(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def tokenizer_mismatch(student: Any, teacher: Any) -> str | None:
    """The first difference between two tokenizers' token -> id maps (vocabulary, then the probe
    texts' ids), as a phrase; None when they agree."""
    sv, tv = student.get_vocab(), teacher.get_vocab()
    if len(sv) != len(tv):
        return f"vocabulary sizes differ ({len(sv)} tokens in the student's, {len(tv)} in the teacher's)"
    for tok in sorted(sv):
        if tv.get(tok) != sv[tok]:
            return f"token {tok!r} is id {sv[tok]} in the student's vocabulary and {tv.get(tok)} in the teacher's"
    for text in PROBES:
        s_ids = student.encode(text, add_special_tokens=False)
        t_ids = teacher.encode(text, add_special_tokens=False)
        if s_ids != t_ids:
            return (
                f"the probe text {text[:40]!r} encodes to {s_ids[:8]}... in the student, {t_ids[:8]}... in the teacher"
            )
    return None


def resolve_teacher(ref: str, student_dir: Path, student_name: str) -> Path:
    """The teacher's checked local HF directory for ``ref`` (``algo.teacher``); ConfigError naming
    both models when it does not share the tokenizer of the student at ``student_dir``
    (``student_name``: how the user named the student)."""
    if str(ref).startswith(("http://", "https://")):
        raise ConfigError(
            f"algo.teacher: {ref!r} is a URL, but a teacher served by SGLang is not supported: the teacher "
            "runs in the trainer process; give a local HF model directory, a GGUF file or a Hub id"
        )
    teacher_dir = resolve_model(str(ref), what="algo.teacher")
    why = tokenizer_mismatch(_load(student_dir), _load(teacher_dir))
    if why is not None:
        raise ConfigError(
            f"algo.teacher: {ref!r} does not share the tokenizer of the student {student_name!r}: {why}. "
            "On-policy distillation scores the student's sampled token ids with the teacher, so both "
            "must tokenize identically (pick a teacher of the same model family and tokenizer)"
        )
    return teacher_dir
