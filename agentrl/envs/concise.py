"""``ConciseEnv``: a multi-turn env where every turn is graded on its own, for measuring credit
assignment (``algo.credit``), not for teaching a model anything useful.

Owns: a conversation of ``n_turns`` user requests ("Turn 2 of 4: reply with one short word about
rivers.", topics drawn from the seed) and a per-turn reward for the reply's length, paid by
``step`` for that turn alone. With ``c_k = min(len(reply_k), max_chars) / max_chars`` (characters
of the assistant's text), a turn that asks for brevity pays::

    r_k = (1 - (1 + waste_penalty) * c_k) / n_turns          ("reply with one short word about X.")

and, with ``pattern="alternate"`` only, a turn that asks for length pays::

    r_k = c_k / n_turns                                      ("reply with a long sentence about X.")

``pattern="same"`` (default): every turn asks for brevity, so an empty reply earns ``1 / n_turns``,
a reply of ``max_chars`` or more earns ``-waste_penalty / n_turns`` (0 by default), and the
episode's return ``sum_k r_k`` lies in ``[-waste_penalty, 1]``. ``pattern="alternate"``: turns
1, 3, 5, ... (1-based) ask for brevity and turns 2, 4, ... ask for length, and the request says
which, so a policy can condition on it; the best return is still 1 (empty short replies, long
replies of ``max_chars`` or more), ``waste_penalty`` applies to the short turns only, and the
return lies in ``[-waste_penalty * ceil(n_turns / 2) / n_turns, 1]``. The episode terminates
after the ``n_turns``-th reply. ``step``'s info says which turn it scored (``turn``, 0-based),
what it wanted (``wants``: "short" or "long") and the reply's ``chars``.

Why it exists: turn k's reward depends only on turn k's reply, so the right credit for turn k's
tokens is known. Outcome broadcast (``credit=outcome``) gives every turn the episode's total, so
each turn's gradient carries the other turns' noise; ``credit=turn_return`` gives turn k its
return-to-go ``sum_{j>=k} r_j`` minus the group's mean at position k, so the last turn sees only
its own reward (earlier turns still carry later turns' noise: this is return-to-go, not an
oracle per-turn credit). With ``pattern="same"`` every turn wants the same behaviour, so the
broadcast total still points every turn the right way; ``"alternate"`` makes the turns want
opposite behaviours, where a total shared by all turns is a worse signal for each.
``bench/bench_credit.py`` compares the credit modes on both patterns.

Does not: check what the reply says (only its length counts), offer tools, or end an episode
early. Note that the episode manager ends an episode at a turn cut by ``max_new_tokens``; the
later turns are then never played, which a model that cannot stop its turns sees as a
one-turn env (and which makes a long reply cost the turns after it if it runs into the cut).
"""

from __future__ import annotations

from agentrl.envs.base import AgentEnv, join_messages, new_stats
from agentrl.errors import ConfigError

PATTERNS = ("same", "alternate")
TOPICS = (
    "rivers",
    "bread",
    "stars",
    "music",
    "trees",
    "rain",
    "cats",
    "glass",
    "salt",
    "maps",
    "clocks",
    "boats",
    "snow",
    "paper",
    "bees",
    "stone",
)


class ConciseEnv(AgentEnv):
    """``n_turns`` requests for a short (or, with ``pattern="alternate"``, on every second turn a
    long) reply, each rewarded for its own length; see the module docstring."""

    def __init__(
        self,
        *,
        n_turns: int = 4,
        max_chars: int = 40,
        waste_penalty: float = 0.0,
        topics: tuple[str, ...] | list[str] = TOPICS,
        pattern: str = "same",
        max_text_length: int = 1 << 20,
    ) -> None:
        super().__init__(max_text_length=max_text_length)
        if isinstance(n_turns, bool) or not isinstance(n_turns, int) or n_turns < 1:
            raise ConfigError(f"ConciseEnv n_turns must be an int >= 1, got {n_turns!r}")
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
            raise ConfigError(f"ConciseEnv max_chars must be an int >= 1, got {max_chars!r}")
        if isinstance(waste_penalty, bool) or not isinstance(waste_penalty, (int, float)) or not waste_penalty >= 0:
            raise ConfigError(f"ConciseEnv waste_penalty must be a number >= 0, got {waste_penalty!r}")
        if isinstance(topics, str) or not topics or not all(isinstance(t, str) and t for t in topics):
            raise ConfigError(f"ConciseEnv topics must be a non-empty list of non-empty strings, got {topics!r}")
        if pattern not in PATTERNS:
            raise ConfigError(f"ConciseEnv pattern must be one of {list(PATTERNS)}, got {pattern!r}")
        self.n_turns, self.max_chars, self.waste_penalty = n_turns, max_chars, float(waste_penalty)
        self.topics, self.pattern = tuple(topics), pattern
        self._turn = -1
        self._topics: list[str] = []

    def wants(self, turn: int) -> str:
        """What turn ``turn`` (0-based) asks for: "short", or "long" (every second turn of "alternate")."""
        return "long" if self.pattern == "alternate" and turn % 2 == 1 else "short"

    def turn_reward(self, reply: str, turn: int = 0) -> float:
        """The reward of ``reply`` given at turn ``turn`` (0-based; only "alternate" looks at it)."""
        c = min(len(reply), self.max_chars) / self.max_chars
        if self.wants(turn) == "long":
            return c / self.n_turns
        return (1.0 - (1.0 + self.waste_penalty) * c) / self.n_turns

    def _request(self, k: int) -> dict:
        ask = "a long sentence" if self.wants(k) == "long" else "one short word"
        return {"role": "user", "content": f"Turn {k + 1} of {self.n_turns}: reply with {ask} about {self._topics[k]}."}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        picks = self.np_random.integers(len(self.topics), size=self.n_turns)
        self._topics = [self.topics[int(i)] for i in picks]
        self._turn = 0
        task = {
            "id": f"concise-{'-'.join(str(int(i)) for i in picks)}",
            "topics": list(self._topics),
            "n_turns": self.n_turns,
            "max_chars": self.max_chars,
            "pattern": self.pattern,
        }
        messages = [self._request(0)]
        return join_messages(messages), {"messages": messages, "tools": [], "task": task}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._turn < 0:
            from gymnasium.error import ResetNeeded

            raise ResetNeeded("step() before reset() or after the episode ended")
        reward = self.turn_reward(action, self._turn)
        info = {"tool_stats": new_stats(), "chars": len(action), "turn": self._turn, "wants": self.wants(self._turn)}
        self._turn += 1
        if self._turn >= self.n_turns:
            self._turn = -1
            return "", reward, True, False, {**info, "messages": [], "final": True}
        messages = [self._request(self._turn)]
        return join_messages(messages), reward, False, False, {**info, "messages": messages, "final": False}
