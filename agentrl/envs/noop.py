"""``NoopEnv``: an instant env for benchmarking the episode manager, not for learning.

Owns: a trivial task ("reply anything"), one tool ``noop`` (offered so prompts render with tools)
and a fixed episode length: every turn is answered at once, and the episode terminates after
``n_turns`` turns with reward ``reward``. A turn containing ``<tool_call>`` gets one ``tool``
message (``observation``, or the turn's text with ``echo=True``); any other turn gets a ``user``
message. Nothing is parsed, run or awaited, so env cost is ~zero and what a benchmark measures
is the manager, the engine and the tokenizer.

Does not: check tool calls, run tools, or vary over seeds beyond the task id.
"""

from __future__ import annotations

from agentrl.envs.base import AgentEnv, join_messages, new_stats
from agentrl.errors import ConfigError


def _noop_schema() -> dict:
    return {
        "type": "function",
        "function": {
            "name": "noop",
            "description": "Does nothing and returns 'ok'.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    }


class NoopEnv(AgentEnv):
    """Ends after ``n_turns`` turns; see the module docstring."""

    def __init__(
        self,
        *,
        n_turns: int = 8,
        reward: float = 1.0,
        observation: str = "ok",
        echo: bool = False,
        prompt: str = "Reply with anything.",
        max_text_length: int = 1 << 20,
    ) -> None:
        super().__init__(max_text_length=max_text_length)
        if n_turns < 1:
            raise ConfigError(f"n_turns must be >= 1, got {n_turns!r}")
        self.n_turns, self.reward, self.observation, self.echo, self.prompt = (
            n_turns,
            float(reward),
            observation,
            echo,
            prompt,
        )
        self._turn = -1

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        n = int((options or {}).get("n_turns", self.n_turns))
        self._turn, self._n = 0, n
        task = {
            "id": f"noop-{int(self.np_random.integers(2**31))}",
            "prompt": self.prompt,
            "answer": None,
            "n_turns": n,
        }
        messages = [{"role": "user", "content": self.prompt}]
        return self.prompt, {"messages": messages, "tools": [_noop_schema()], "task": task}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._turn < 0:
            from gymnasium.error import ResetNeeded

            raise ResetNeeded("step() before reset() or after the episode ended")
        self._turn += 1
        stats = new_stats()
        if self._turn >= self._n:
            self._turn = -1
            return "", self.reward, True, False, {"messages": [], "tool_stats": stats, "final": True}
        text = action if self.echo else self.observation
        if "<tool_call>" in action:
            stats["calls"] = 1
            messages = [{"role": "tool", "name": "noop", "content": text}]
        else:
            messages = [{"role": "user", "content": text}]
        return join_messages(messages), 0.0, False, False, {"messages": messages, "tool_stats": stats, "final": False}

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        return self.reset(seed=seed, options=options)

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return self.step(action)
