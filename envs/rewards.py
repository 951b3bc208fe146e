"""Rule rewards: pull a final answer out of model text and compare it with the ground truth.

Owns: answer extraction (``extract_boxed``, ``extract_gsm8k_answer``, ``extract_answer``),
number normalization (``normalize_number``), comparison (``answers_match``) and the rewards built
from them (``gsm8k_reward``, ``rule_reward``). Pure functions of strings, usable by any env.

Does not: run code (unit-test rewards live in the env that owns a sandbox), call a model judge,
or give partial credit for reasoning.

``extract_answer`` looks, in this order, for the last ``\\boxed{...}``, the last ``#### x``, the
last ``answer: x`` / ``answer is x`` (case-insensitive), and finally the last number in the text.
Numbers compare exactly as fractions after normalization (``1,234.50`` == ``1234.5`` == ``2469/2``;
``\\frac{1}{2}`` == ``0.5``); anything else compares as a whitespace- and case-normalized string.
"""
from __future__ import annotations

import re
from fractions import Fraction

_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?"
_NUMBER_RE = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?|"
                        r"(?<![\w.])[-+]?\.\d+")
_GSM8K_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_RE = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*([^\n]+)", re.IGNORECASE)
_FRAC_RE = re.compile(r"^\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_BOXED = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces respected."""
    best: tuple[int, str] | None = None
    for cmd in _BOXED:
        start = text.rfind(cmd + "{")
        while start != -1:
            i, depth = start + len(cmd) + 1, 1
            j = i
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            if depth == 0:
                if best is None or start > best[0]:
                    best = (start, text[i: j - 1].strip())
                break
            start = text.rfind(cmd + "{", 0, start)  # unclosed: try the one before
    return best[1] if best else None


def normalize_number(text: str) -> str | None:
    """Canonical string of a number written in ``text``, or None if it is not one number.

    Strips ``$``, ``%``, thousands commas, surrounding ``\\text{}``/spaces and a trailing period;
    accepts integers, decimals, scientific notation, ``a/b`` and ``\\frac{a}{b}``. Integers come
    back as ``"42"``, other values as a reduced fraction ``"1/3"`` (exact, so 0.1+0.2 issues vanish).
    """
    value = _to_fraction(text)
    if value is None:
        return None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _clean(text: str) -> str:
    s = str(text).strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "").replace("\\!", "")
    s = s.strip().rstrip(".").strip()
    return s


def _to_fraction(text: str) -> Fraction | None:
    s = _clean(text)
    m = _FRAC_RE.match(s)
    if m:
        num, den = _to_fraction(m.group(1)), _to_fraction(m.group(2))
        return None if num is None or not den else num / den
    s = s.replace(" ", "")
    if "/" in s:
        num_s, _, den_s = s.partition("/")
        num, den = _to_fraction(num_s), _to_fraction(den_s)
        return None if num is None or not den else num / den
    if not s or not re.fullmatch(_NUM, s) or not re.search(r"\d", s):
        return None
    if "," in s:
        s = s.replace(",", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _first_token(text: str) -> str:
    """The answer part of ``#### 1,234 dollars`` or ``answer: 42.`` -> ``1,234`` / ``42``."""
    s = text.strip()
    boxed = extract_boxed(s)
    if boxed is not None:
        return boxed
    m = _NUMBER_RE.search(s)
    if m and _to_fraction(m.group(0)) is not None and s[: m.start()].strip(" $:=*") == "":
        return m.group(0)
    return s.rstrip(".").strip().strip("*").strip()


def extract_gsm8k_answer(text: str) -> str | None:
    """The final answer after the last ``####`` (GSM8K's format), or None if there is none."""
    matches = _GSM8K_RE.findall(text)
    if not matches:
        return None
    ans = _first_token(matches[-1])
    return ans or None


def extract_last_number(text: str) -> str | None:
    """The last number written in ``text`` (``1,234.5``, ``-3``, ``2/3``), or None."""
    nums = [m.group(0) for m in _NUMBER_RE.finditer(text)]
    return nums[-1].strip() if nums else None


def extract_answer(text: str) -> str | None:
    """Final answer by precedence: ``\\boxed{}`` > ``####`` > ``answer: x`` > last number."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    gsm = extract_gsm8k_answer(text)
    if gsm is not None:
        return gsm
    m = _ANSWER_RE.findall(text)
    if m:
        ans = _first_token(m[-1])
        if ans:
            return ans
    return extract_last_number(text)


def _norm_text(text: str) -> str:
    return re.sub(r"\s+", " ", _clean(text)).strip().lower()


def answers_match(pred: str | None, truth: object) -> bool:
    """True when ``pred`` equals ``truth``: exactly as numbers if both parse, else as normalized text."""
    if pred is None or truth is None:
        return False
    truth_s = str(truth)
    a, b = _to_fraction(pred), _to_fraction(truth_s)
    if a is not None and b is not None:
        return a == b
    if b is not None:
        return False  # the truth is a number and the prediction is not
    return _norm_text(pred) == _norm_text(truth_s) != ""


def gsm8k_reward(text: str, ground_truth: str, *, method: str = "strict", format_score: float = 0.0,
                 score: float = 1.0) -> float:
    """GSM8K rule reward (as veRL's): ``score`` if the answer after ``####`` equals the ground truth,
    ``format_score`` if an answer was found but is wrong, 0.0 if none was found.

    ``method="strict"`` requires ``####``; ``"flexible"`` falls back to the last number.
    ``ground_truth`` may be the bare answer or a full GSM8K solution ending in ``#### x``.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    truth = extract_gsm8k_answer(ground_truth) if "####" in str(ground_truth) else str(ground_truth)
    pred = extract_gsm8k_answer(text)
    if pred is None and method == "flexible":
        pred = extract_last_number(text)
    if pred is None:
        return 0.0
    return score if answers_match(pred, truth) else format_score


def rule_reward(text: str, ground_truth: object) -> float:
    """1.0 if ``extract_answer(text)`` matches ``ground_truth`` (see ``answers_match``), else 0.0."""
    return 1.0 if answers_match(extract_answer(text), ground_truth) else 0.0
