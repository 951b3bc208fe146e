"""``CountdownEnv``: reach a target with a few given numbers (each at most once) and ``+ - * /``.

A task is drawn so that it has a solution: the target is the value of a random expression over the
numbers. The ``calc`` tool evaluates an expression exactly; the final answer (a turn with no tool call)
is scored 1.0 when its last line is an expression that uses only the given numbers, each at most once,
and equals the target, else 0.0. Held-out tasks (``split="eval"``) use numbers training never draws.
"""

from __future__ import annotations

from collections import Counter

from agentrl.envs.base import ToolEnv
from agentrl.errors import ToolCallError
from agentrl.tools.base import tool
from agentrl_countdown.arith import ArithError, evaluate, numbers_used

#: the numbers each split draws from (disjoint: eval tasks are never seen in training)
POOLS = {"train": [1, 2, 3, 4, 5, 6, 7, 8, 10, 25, 50], "eval": [9, 11, 12, 75, 100]}
OPS = "+-*"


@tool
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Whole numbers with + - * / and parentheses, e.g. "(25 - 4) * 3".
    """
    try:
        value = evaluate(expression)
    except ArithError as e:
        raise ToolCallError(str(e)) from None
    return str(value)


def _final_expression(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return last.rpartition("=")[0].strip() if last.count("=") == 1 else last


def solves(task: dict, text: str) -> bool:
    """Whether ``text``'s final expression reaches the target with the task's numbers."""
    expr = _final_expression(text)
    try:
        value, used = evaluate(expr), numbers_used(expr)
    except ArithError:
        return False
    return value == task["target"] and not Counter(used) - Counter(task["numbers"])


class CountdownEnv(ToolEnv):
    has_eval_split = True

    def __init__(self, *, split: str = "train", n_numbers: int = 4, **kwargs) -> None:
        if split not in POOLS:
            raise ValueError(f"split must be one of {sorted(POOLS)}, got {split!r}")
        if not 2 <= n_numbers <= min(len(p) for p in POOLS.values()):
            raise ValueError(f"n_numbers must be in 2..5, got {n_numbers!r}")
        self.split, self.n_numbers = split, n_numbers
        self.tools = [calc]
        super().__init__(**kwargs)

    def sample_task(self, rng, options):
        pool = POOLS[self.split]
        numbers = [int(n) for n in rng.choice(pool, size=self.n_numbers, replace=False)]
        expr = str(numbers[0])
        for n in numbers[1:]:
            expr = f"({expr} {OPS[int(rng.integers(len(OPS)))]} {n})"
        target = int(evaluate(expr))
        return {
            "id": f"countdown-{self.split}-{'-'.join(map(str, numbers))}-{target}",
            "numbers": numbers,
            "target": target,
            "solution": expr,
        }

    def initial_messages(self, task):
        nums = ", ".join(map(str, task["numbers"]))
        return [
            {
                "role": "user",
                "content": f"Reach {task['target']} using the numbers {nums}, each at most once, with + - * / and "
                "parentheses. Try expressions with the calc tool if you like. End with the expression alone on "
                "the last line.",
            }
        ]

    async def score(self, task, final_text, transcript):
        return 1.0 if solves(task, final_text) else 0.0
