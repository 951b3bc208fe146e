"""``EchoEnv``: the smallest useful ``ToolEnv``: say a secret word back after reading it with a tool.

It keeps held-out tasks the way the env contract asks: ``split="eval"`` draws words training never sees."""

from __future__ import annotations

from agentrl.envs.base import ToolEnv
from agentrl.tools.base import tool

WORDS = {"train": ["apple", "river", "cobalt", "meadow", "lantern", "quartz"], "eval": ["harbor", "saffron", "glacier"]}


@tool
def reveal(hint: str = "") -> str:
    """Reveal the secret word of this episode.

    Args:
        hint: Ignored.
    """
    return "The secret word is in the task; this tool only says hello."


class EchoEnv(ToolEnv):
    has_eval_split = True

    def __init__(self, *, split: str = "train", **kwargs) -> None:
        if split not in WORDS:
            raise ValueError(f"split must be one of {sorted(WORDS)}, got {split!r}")
        self.split = split
        self.tools = [reveal]
        super().__init__(**kwargs)

    def sample_task(self, rng, options):
        words = WORDS[self.split]
        word = words[int(rng.integers(len(words)))]
        return {"id": f"echo-{word}", "prompt": f"Say the word {word!r} and nothing else.", "answer": word}

    def initial_messages(self, task):
        return [{"role": "user", "content": task["prompt"]}]

    async def score(self, task, final_text, transcript):
        return 1.0 if final_text.strip().strip("'\".").lower() == task["answer"] else 0.0
