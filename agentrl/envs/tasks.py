"""Procedural tasks with verifiable answers, a difficulty knob and a disjoint held-out split.

Owns: ``generate_task(seed, difficulty, split)``, ``sample_task(rng, ...)``, ``eval_tasks(n, ...)`` and
``distinct_tasks`` (held-out sets of distinct tasks from any seeded generator).
Each task is a JSON-able dict ``{id, prompt, answer, difficulty, kind, solution}``; difficulty-5 tasks
also carry ``entry_point`` (a function name) and ``tests`` (assert statements) and an answer of None.
``solution`` is a short reference Python program: for difficulty 1-4 it prints the answer (run it and
you get ``answer``), for difficulty 5 it defines the function. It is never shown to the model; the
SFT warm start (``agentrl.warmstart.sft``) uses it to script oracle demonstrations.

Difficulty: 1 ``a + b`` with small numbers; 2 multi-operation arithmetic; 3 sums over ranges
with filters; 4 problems that really want code (sum of primes below N, n-th Fibonacci mod m,
digit sum of a power, divisor counts, Collatz steps); 5 write a function that passes unit tests.

Splits are disjoint *by content*: a task belongs to ``eval`` iff a hash of its prompt falls in a
fixed 10% bucket, and the generator redraws until the task lands in the requested split, so no
held-out prompt is ever produced for training whatever the seed. Generation is a pure function of
(seed, difficulty, split). Does not: score answers (``agentrl.envs.rewards``) or run tests.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

import numpy as np

SPLITS = ("train", "eval")
DIFFICULTIES = (1, 2, 3, 4, 5)
_EVAL_BUCKETS = 10  # 1 in 10 prompts is held out
_MAX_REDRAWS = 1000


def _is_eval(prompt: str) -> bool:
    h = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "little")
    return h % _EVAL_BUCKETS == 0


def _i(rng: np.random.Generator, lo: int, hi: int) -> int:
    """Uniform int in [lo, hi] as a Python int (JSON-able)."""
    return int(rng.integers(lo, hi + 1))


# ------------------------------------------------------------------ difficulty 1-2: arithmetic
def _add(rng):
    a, b = _i(rng, 0, 99), _i(rng, 0, 99)
    return "add", f"What is {a} + {b}?", a + b, f"print({a} + {b})"


def _arith(rng):
    n_ops = _i(rng, 2, 4)
    expr = str(_i(rng, 2, 99))
    for _ in range(n_ops):
        op = ["+", "-", "*"][_i(rng, 0, 2)]
        expr += f" {op} {_i(rng, 2, 99) if op != '*' else _i(rng, 2, 19)}"
    first_op = expr.index(" ", expr.index(" ") + 3)
    toks = expr.split()
    if toks[1] in "+-" and toks[3] == "*":  # (a + b) * c: parenthesize only where it changes the value
        expr = "(" + expr[:first_op] + ")" + expr[first_op:]
    # eval of a string we built from digits, spaces, + - * and parentheses only.
    return "arith", f"Compute {expr}.", int(eval(expr, {"__builtins__": {}}, {})), f"print({expr})"


# ------------------------------------------------------------------ difficulty 3: ranges/filters
def _multiples(rng):
    k, m, n = _i(rng, 2, 9), _i(rng, 2, 9), _i(rng, 100, 2000)
    while m == k:
        m = _i(rng, 2, 9)
    ans = sum(x for x in range(1, n) if x % k == 0 or x % m == 0)
    return (
        "multiples",
        f"What is the sum of all positive integers below {n} that are multiples of {k} or {m}?",
        ans,
        f"print(sum(x for x in range(1, {n}) if x % {k} == 0 or x % {m} == 0))",
    )


def _squares(rng):
    a = _i(rng, 1, 50)
    b = a + _i(rng, 10, 200)
    parity = ["odd", "even"][_i(rng, 0, 1)]
    ans = sum(x * x for x in range(a, b + 1) if x % 2 == (1 if parity == "odd" else 0))
    return (
        "squares",
        f"What is the sum of the squares of the {parity} integers from {a} to {b} inclusive?",
        ans,
        f"print(sum(x * x for x in range({a}, {b} + 1) if x % 2 == {1 if parity == 'odd' else 0}))",
    )


# ------------------------------------------------------------------ difficulty 4: needs code
def _primes_below(n: int) -> list[int]:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"[: min(2, n)]
    for p in range(2, int(n**0.5) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(range(p * p, n, p)))
    return [i for i in range(n) if sieve[i]]


def _prime_sum(rng):
    n = _i(rng, 1000, 50000)
    return (
        "prime_sum",
        f"What is the sum of all prime numbers below {n}?",
        sum(_primes_below(n)),
        f"n = {n}\nis_p = [True] * n\nfor i in range(2, int(n ** 0.5) + 1):\n    if is_p[i]:\n"
        f"        for j in range(i * i, n, i):\n            is_p[j] = False\nprint(sum(i for i in range(2, n) if is_p[i]))",  # noqa: E501
    )


def _fib_mod(rng):
    n, m = _i(rng, 100, 10000), _i(rng, 1000, 99999)
    a, b = 0, 1
    for _ in range(n):
        a, b = b, (a + b) % m
    return (
        "fib_mod",
        f"Let F(0) = 0, F(1) = 1 and F(k) = F(k-1) + F(k-2). What is F({n}) mod {m}?",
        a,
        f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, (a + b) % {m}\nprint(a)",
    )


def _digit_sum_pow(rng):
    a, b = _i(rng, 2, 99), _i(rng, 50, 500)
    return (
        "digit_sum_pow",
        f"What is the sum of the decimal digits of {a}^{b}?",
        sum(map(int, str(a**b))),
        f"print(sum(int(d) for d in str({a} ** {b})))",
    )


def _divisors(rng):
    n = _i(rng, 10_000, 10_000_000)
    count = sum(2 if d * d != n else 1 for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return (
        "divisors",
        f"How many positive divisors does {n} have?",
        count,
        f"n = {n}\nprint(sum(1 if d * d == n else 2 for d in range(1, int(n ** 0.5) + 1) if n % d == 0))",
    )


def _collatz(rng):
    n = _i(rng, 100, 100_000)
    steps, x = 0, n
    while x != 1:
        x = x // 2 if x % 2 == 0 else 3 * x + 1
        steps += 1
    return (
        "collatz",
        f"Starting from {n}, repeatedly replace n by n/2 if n is even and by 3n+1 if it is odd. "
        f"How many steps does it take to reach 1?",
        steps,
        f"n, s = {n}, 0\nwhile n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    s += 1\nprint(s)",
    )


# ------------------------------------------------------------------ difficulty 5: unit tests
def _fn_task(name: str, signature: str, spec: str, ref: Callable, inputs: list[tuple], solution: str) -> tuple:
    tests = [f"assert {name}({', '.join(map(repr, args))}) == {ref(*args)!r}" for args in inputs]
    prompt = (
        f"Write a Python function `{name}{signature}` that {spec} "
        f"Give the complete function in a ```python code block in your final answer."
    )
    return name, prompt, tests, solution


def _fn_digit_power(rng):
    k = _i(rng, 2, 5)
    ins = [(_i(rng, 0, 10**6),) for _ in range(5)] + [(0,)]
    return _fn_task(
        "digit_power_sum",
        "(n: int) -> int",
        f"returns the sum of the {k}-th powers of the decimal digits of the non-negative integer n.",
        lambda n: sum(int(d) ** k for d in str(n)),
        ins,
        f"def digit_power_sum(n):\n    return sum(int(d) ** {k} for d in str(n))",
    )


def _fn_count_div(rng):
    k = _i(rng, 2, 13)
    ins = []
    for _ in range(6):
        a = _i(rng, -500, 500)
        ins.append((a, a + _i(rng, 0, 1000)))
    return _fn_task(
        "count_divisible",
        "(a: int, b: int) -> int",
        f"returns how many integers x with a <= x <= b are divisible by {k}.",
        lambda a, b: b // k - (a - 1) // k,
        ins,
        f"def count_divisible(a, b):\n    return b // {k} - (a - 1) // {k}",
    )


def _fn_rotate(rng):
    ins = [([_i(rng, 0, 9) for _ in range(_i(rng, 0, 8))], _i(rng, -10, 10)) for _ in range(6)]
    return _fn_task(
        "rotate_left",
        "(xs: list, k: int) -> list",
        "returns the list xs rotated left by k positions (k may be negative or larger than "
        "len(xs); an empty list stays empty).",
        lambda xs, k: xs[k % len(xs) :] + xs[: k % len(xs)] if xs else [],
        ins,
        "def rotate_left(xs, k):\n    if not xs:\n        return []\n    k %= len(xs)\n    return xs[k:] + xs[:k]",
    )


_KINDS: dict[int, list[Callable]] = {
    1: [_add],
    2: [_arith],
    3: [_multiples, _squares],
    4: [_prime_sum, _fib_mod, _digit_sum_pow, _divisors, _collatz],
    5: [_fn_digit_power, _fn_count_div, _fn_rotate],
}


def generate_task(seed: int, difficulty: int = 2, split: str = "train") -> dict:
    """The task for ``seed`` at ``difficulty`` in ``split``; a pure function of its arguments."""
    if difficulty not in _KINDS:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    # The split is part of the seed so the two splits do not redraw along the same sequence.
    rng = np.random.default_rng([int(seed) & (2**63 - 1), difficulty, SPLITS.index(split)])
    kinds = _KINDS[difficulty]
    for _ in range(_MAX_REDRAWS):
        maker = kinds[_i(rng, 0, len(kinds) - 1)]
        out = maker(rng)
        if _is_eval(out[1]) == (split == "eval"):
            break
    else:  # unreachable for the kinds above: every kind has far more than 1000 prompts per split
        raise RuntimeError(f"could not draw a {split} task at difficulty {difficulty}")
    task_id = f"d{difficulty}-{split}-" + hashlib.blake2b(out[1].encode(), digest_size=6).hexdigest()
    if difficulty == 5:
        name, prompt, tests, solution = out
        return {
            "id": task_id,
            "prompt": prompt,
            "answer": None,
            "difficulty": difficulty,
            "kind": "function",
            "entry_point": name,
            "tests": tests,
            "solution": solution,
        }
    kind, prompt, answer, solution = out
    return {
        "id": task_id,
        "prompt": prompt,
        "answer": str(answer),
        "difficulty": difficulty,
        "kind": kind,
        "solution": solution,
    }


def sample_task(rng: np.random.Generator, difficulty: int | list[int] = 2, split: str = "train") -> dict:
    """A task drawn with ``rng`` (e.g. an env's ``np_random``); a list of difficulties mixes them."""
    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    if not levels:
        raise ValueError("difficulty must be an int or a non-empty list of ints")
    level = levels[int(rng.integers(len(levels)))]
    return generate_task(int(rng.integers(2**63 - 1)), level, split)


def eval_tasks(n: int, difficulty: int = 2, *, seed: int = 0) -> list[dict]:
    """``n`` held-out tasks (distinct prompts where the kind has enough of them), fixed by ``seed``."""
    return distinct_tasks(lambda s: generate_task(s, difficulty, "eval"), n, seed=seed)


def distinct_tasks(make: Callable[[int], dict], n: int, *, seed: int = 0) -> list[dict]:
    """Up to ``n`` tasks of distinct ``id`` from ``make(task_seed)``, the seeds fixed by ``seed``
    (20 x ``n`` tries: a generator with fewer distinct tasks gives fewer)."""
    out, seen = [], set()
    for i in range(n * 20):
        t = make(seed * 1_000_003 + i)
        if t["id"] not in seen:
            seen.add(t["id"])
            out.append(t)
            if len(out) == n:
                break
    return out
