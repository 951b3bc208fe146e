"""Rule rewards: pull a final answer out of model text and compare it with the ground truth.

Owns: answer extraction (``extract_boxed``, ``extract_gsm8k_answer``, ``extract_answer_tag``,
``extract_answer``), number normalization (``normalize_number``), comparison (``answers_match``)
and the rewards built from them (``gsm8k_reward``, ``rule_reward``). Pure functions of strings,
usable by any env.

Does not: run code (unit-test rewards live in the env that owns a sandbox), call a model judge,
or give partial credit for reasoning.

``extract_answer`` looks, in this order, for the last ``\\boxed{...}``, the last ``#### x``, the
last ``<answer>x</answer>``, the last ``answer: x`` / ``answer is x`` (case-insensitive), and
finally the last number in the text. "The last ``####``" (or ``answer:``) is the last marker in
the text with something after it on its line: ``#### 42 #### 43`` is 43, ``#### 42\n####`` is 42.
Numbers compare exactly as fractions after normalization (``1,234.50`` == ``1234.5`` == ``2469/2``;
``\\frac{1}{2}`` == ``0.5``); anything else compares as a whitespace- and case-normalized string.
A number is read whole or not at all: ``3.14.15``, ``1,234,56`` and ``1e5.3`` are not numbers (not
3.14, 1234 or 1), so they never equal a numeric ground truth.

Where ``gsm8k_reward`` differs from veRL's ``gsm8k.compute_score`` (read, not copied), and why:

* veRL looks only at the last 300 characters (to bound its regex); this reads the whole text, so
  an answer followed by a long sign-off still counts. The scanners here are linear, so no cut.
* veRL's strict form is ``#### `` + one space + ``-?[0-9.,]+``; here any spacing, a leading ``$``,
  ``**`` or ``:`` and trailing words (``#### $1,234 dollars``) are accepted, and a non-numeric
  answer is kept as text. Both take the last marker that has an answer: veRL the last
  ``#### <digits>``, this the last ``####`` with anything after it (``#### 42 #### x`` is "x"
  here, 42 in veRL).
* veRL compares strings after deleting ``,`` and ``$`` (``42.0`` != ``42``; ``3.14.15`` is just
  a string); here numbers compare exactly (``42.0`` == ``42``) and malformed ones never match a
  number, as above. Format differences must not cost reward; a wrong number must.
* veRL expects the bare answer as ground truth; a full GSM8K solution ending in ``#### x`` works here.
* ``method="flexible"``: veRL takes the last ``-?[0-9.,]+`` run that is not ``""`` or ``"."``
  (``3.14.15`` included); here the last well-formed number.
* No answer: veRL returns int 0, this 0.0.

Model output is data: every function here is linear (or close) in the text, with no recursion on
anything the text controls. A number is compared as a number only when that is cheap: at most
``MAX_DIGITS`` digits and an exponent of at most ``MAX_EXPONENT`` in magnitude. A longer one is not
a number here (``1e30000000`` is "not equal" to ``42`` at once instead of building a
30-million-digit integer); two such answers can still match as identical text.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?"
# A number is read whole or not at all, never as the prefix or suffix of a longer malformed one:
# it may not stop before ".5", ",5", "5", "e5" or "/5", nor start after "x", ".", "5," or "5/"
# ("3.14.15" and "1,234,56" hold no number, not 3.14 or 56). Backtracking is bounded by one digit
# run: a match can only start where a run starts.
_NUMBER_START = r"(?<![\w.])(?<!\d[,/])"
_NUMBER_END = r"(?![.,]?\d|[eE][-+]?\d|\s*/\s*\d)"
_NUMBER_RE = re.compile(
    _NUMBER_START
    + r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"
    + _NUMBER_END
    + "|"
    + _NUMBER_START
    + r"[-+]?\.\d+(?:[eE][-+]?\d+)?"
    + _NUMBER_END
)
_GSM8K_MARK = re.compile(r"#{4,}")
_ANSWER_MARK = re.compile(r"answer\s*(?:is|:|=)\s*:?", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<(/?)answer>", re.IGNORECASE)
_FRAC_RE = re.compile(r"^\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
# A box opening (group 1) or one brace: one forward pass over these matches every brace.
_BRACE_RE = re.compile(r"(\\boxed\{|\\fbox\{)|[{}]")
#: a number is compared as a number only within these bounds (Fraction's cost grows with them;
#: 1e30000000 took 86 s); past them it is "not a number" here and compares as text
MAX_DIGITS = 500
MAX_EXPONENT = 500


def extract_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``) that is closed, nested braces respected."""
    # One pass with a stack of open braces: a brace's partner depends only on the text after it, so
    # this matches what scanning forward from each box would, in linear time.
    stack: list[int] = []  # content start of an open box, or -1 for a plain brace
    best: tuple[int, int] | None = None  # (content start, content end) of the box opened last
    for m in _BRACE_RE.finditer(text):
        if m.group(1):
            stack.append(m.end())
        elif m.group() == "{":
            stack.append(-1)
        elif stack:
            i = stack.pop()
            if i != -1 and (best is None or i > best[0]):
                best = (i, m.start())
    return text[best[0] : best[1]].strip() if best else None


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
    """The exact value of ``text`` (a number, ``a/b`` or ``\\frac{a}{b}``), or None if it is not one
    or is too big to compare cheaply. No recursion past one level: ``a`` and ``b`` are plain numbers."""
    s = _clean(text)
    m = _FRAC_RE.match(s)
    if m:
        return _ratio(_plain_number(m.group(1)), _plain_number(m.group(2)))
    s = s.replace(" ", "")
    if "/" in s:
        num_s, _, den_s = s.partition("/")
        return _ratio(_plain_number(num_s), _plain_number(den_s))
    return _plain_number(s)


def _ratio(num: Fraction | None, den: Fraction | None) -> Fraction | None:
    return None if num is None or not den else num / den


def _plain_number(text: str) -> Fraction | None:
    """``1,234.5e-3``-style text -> its value, bounded by MAX_DIGITS / MAX_EXPONENT; else None."""
    s = _clean(text).replace(" ", "")
    if not s or not re.fullmatch(_NUM, s) or not re.search(r"\d", s):
        return None
    if "," in s:
        s = s.replace(",", "")
    mantissa, _, exponent = s.lower().partition("e")
    digits = len(mantissa.lstrip("+-").replace(".", ""))  # leading zeros too: 0.000...1 costs as much
    exponent = exponent.lstrip("+-").lstrip("0")
    if digits > MAX_DIGITS or len(exponent) > len(str(MAX_EXPONENT)) or int(exponent or 0) > MAX_EXPONENT:
        return None
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


def _last_marked(text: str, marker: re.Pattern) -> str | None:
    """What follows the last ``marker`` match that has something after it on its line (up to the
    line's end or the next marker), stripped; None if no marker has. Linear: scanning backwards,
    each marker's search for a newline stops at the next marker, so the spans never overlap."""
    nxt = len(text)
    for m in reversed(list(marker.finditer(text))):
        stop = text.find("\n", m.end(), nxt)
        content = text[m.end() : stop if stop != -1 else nxt].strip()
        if content:
            return content
        nxt = m.start()
    return None


def extract_gsm8k_answer(text: str) -> str | None:
    """The final answer after the last ``####`` that has one on its line (GSM8K's format), or None."""
    content = _last_marked(text, _GSM8K_MARK)
    return (_first_token(content) or None) if content is not None else None


def extract_answer_tag(text: str) -> str | None:
    """The answer inside the last closed ``<answer>...</answer>`` (case-insensitive), or None."""
    open_end, best = None, None
    for m in _ANSWER_TAG.finditer(text):
        if not m.group(1):
            open_end = m.end()
        elif open_end is not None:
            best, open_end = (open_end, m.start()), None
    if best is None:
        return None
    return _first_token(text[best[0] : best[1]]) or None


def extract_last_number(text: str) -> str | None:
    """The last number written in ``text`` (``1,234.5``, ``-3``, ``2/3``), or None."""
    nums = [m.group(0) for m in _NUMBER_RE.finditer(text)]
    return nums[-1].strip() if nums else None


def extract_answer(text: str) -> str | None:
    """Final answer by precedence: ``\\boxed{}`` > ``####`` > ``<answer>`` > ``answer: x`` > last number."""
    for extract in (extract_boxed, extract_gsm8k_answer, extract_answer_tag):
        ans = extract(text)
        if ans is not None:
            return ans
    content = _last_marked(text, _ANSWER_MARK)
    if content is not None:
        ans = _first_token(content)
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


def gsm8k_reward(
    text: str, ground_truth: str, *, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
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
