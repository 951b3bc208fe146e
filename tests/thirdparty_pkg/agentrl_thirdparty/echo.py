"""``EchoEnv``: the smallest useful ``ToolEnv``: say a secret word back after reading it with a tool."""
from __future__ import annotations

from agentrl.envs.base import ToolEnv
from agentrl.tools.base import tool

WORDS = ["apple", "river", "cobalt", "meadow", "lantern", "quartz"]


@tool
def reveal(hint: str = "") -> str:
    """Reveal the secret word of this episode.

    Args:
        hint: Ignored.
    """
    return "The secret word is in the task; this tool only says hello."


class EchoEnv(ToolEnv):
    def __init__(self, **kwargs) -> None:
        self.tools = [reveal]
        super().__init__(**kwargs)

    def sample_task(self, rng, options):
        word = WORDS[int(rng.integers(len(WORDS)))]
        return {"id": f"echo-{word}", "prompt": f"Say the word {word!r} and nothing else.", "answer": word}

    def initial_messages(self, task):
        return [{"role": "user", "content": task["prompt"]}]

    async def score(self, task, final_text, transcript):
        return 1.0 if final_text.strip().strip("'\".").lower() == task["answer"] else 0.0
