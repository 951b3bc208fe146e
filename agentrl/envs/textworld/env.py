"""``TextWorldEnv``: a long-horizon household text world played through typed tools, sparse reward.

Owns: the tools (``look``, ``go``, ``open``, ``close``, ``take``, ``put``, ``clean``, ``heat``,
``cool``, ``inventory``) bound to the episode's ``World``, the prompt, the reward and
``state_key()``. The episode ends when the goal is met (reward ``1 - step_cost * turns``, at
least 0) or when the model replies without a tool call (reward 1 only if the goal is met, which it
cannot be then, so 0); the turn limit is the episode manager's (registered hint: 40 turns; the
oracle needs 10-30 actions at the default difficulty). One action per turn by default
(``max_calls_per_turn=1``): a turn is one step of the world, which is what ``state_key`` anchors.

``state_key()`` is the hash of the world state the *next* turn starts from (``World.state_key``):
the episode manager records it before every turn, and ``algo.credit=gigpo`` groups turns of one
task's samples that start from the same state. ``oracle_actions()`` is the oracle plan from the
current state. Does not: generate worlds (``gen``) or apply rules (``world``).
"""

from __future__ import annotations

import json

import numpy as np

from agentrl.envs.base import ToolEnv
from agentrl.envs.textworld.gen import DIFFICULTIES, SPLITS, generate_world
from agentrl.envs.textworld.oracle import Action, oracle_actions
from agentrl.envs.textworld.world import World
from agentrl.errors import ConfigError
from agentrl.tools.base import Tool, tool

SYSTEM_PROMPT = (
    "You are an agent in a house. Act with exactly one tool call per turn: look, go(room), open(receptacle), "
    "close(receptacle), take(obj), put(obj, receptacle), clean(obj) at a sink, heat(obj) at a microwave, "
    "cool(obj) at a fridge, inventory. You can hold one object. Closed receptacles must be opened to see or "
    "use their contents. The episode ends when the task is done."
)


def hermes_call(action: Action) -> str:
    """One oracle action as a Hermes tool-call turn (what the model should write)."""
    name, args = action
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def _tools(env: TextWorldEnv) -> list[Tool]:
    """Tools bound to ``env``'s current world (looked up at call time: reset swaps the world)."""

    def w() -> World:
        return env.world

    async def look() -> str:
        """Describe the room you are in: receptacles (with the contents of open ones) and exits."""
        return w().look()

    async def go(room: str) -> str:
        """Walk to an adjacent room.

        Args:
            room: the room's name, e.g. "kitchen"
        """
        return w().go(room)

    async def open(receptacle: str) -> str:  # noqa: A001 - the action's name
        """Open a closed receptacle (cabinet, drawer, box, fridge, microwave) and see inside.

        Args:
            receptacle: its name, e.g. "cabinet 2"
        """
        return w().open(receptacle)

    async def close(receptacle: str) -> str:
        """Close an open receptacle.

        Args:
            receptacle: its name, e.g. "cabinet 2"
        """
        return w().close(receptacle)

    async def take(obj: str) -> str:
        """Pick up an object from an open receptacle in this room (you hold at most one).

        Args:
            obj: the object's name, e.g. "mug 1"
        """
        return w().take(obj)

    async def put(obj: str, receptacle: str) -> str:
        """Put the object you hold in or on a receptacle in this room (open it first if closed).

        Args:
            obj: the object you hold, e.g. "mug 1"
            receptacle: where to put it, e.g. "cabinet 2"
        """
        return w().put(obj, receptacle)

    async def clean(obj: str) -> str:
        """Clean the object you hold; needs a sink in this room.

        Args:
            obj: the object you hold
        """
        return w().treat("clean", obj)

    async def heat(obj: str) -> str:
        """Heat the object you hold; needs a microwave in this room.

        Args:
            obj: the object you hold
        """
        return w().treat("heat", obj)

    async def cool(obj: str) -> str:
        """Cool the object you hold; needs a fridge in this room.

        Args:
            obj: the object you hold
        """
        return w().treat("cool", obj)

    async def inventory() -> str:
        """Say what you hold."""
        return w().inventory()

    return [tool(f) for f in (look, go, open, close, take, put, clean, heat, cool, inventory)]


class TextWorldEnv(ToolEnv):
    """Household tasks ("put a clean mug in cabinet 2") in a procedurally generated house.

    Args:
        difficulty: 1 (fetch and place), 2 (clean it first; default), 3 (heat or cool it first),
            or a list to mix.
        split: ``"train"`` or ``"eval"`` (held-out worlds, disjoint from training ones).
        step_cost: subtracted from the success reward per turn used (default 0: reward 1 on success).
        worlds: 0 (default): every task seed its own world; N > 0: task seeds folded onto N worlds
            per split (a fixed game set, as ALFWorld's; a short test of learning can overfit it).
        system_prompt: overrides the default prompt; ``""`` sends none.
        **kwargs: ``ToolEnv`` options (parser, on_bad_call, max_calls_per_turn (default 1), ...).
    """

    has_eval_split = True

    def __init__(
        self,
        *,
        difficulty: int | list[int] = 2,
        split: str = "train",
        step_cost: float = 0.0,
        worlds: int = 0,
        system_prompt: str | None = None,
        **kwargs,
    ) -> None:
        levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
        if not levels or any(d not in DIFFICULTIES for d in levels):
            raise ConfigError(f"difficulty must be in {DIFFICULTIES} (or a list of them), got {difficulty!r}")
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        if not 0.0 <= step_cost < 1.0:
            raise ConfigError(f"step_cost must be in [0, 1), got {step_cost!r}")
        if not isinstance(worlds, int) or worlds < 0:
            raise ConfigError(f"worlds must be an int >= 0 (0 = no fixed set), got {worlds!r}")
        self.difficulty, self.split, self.step_cost, self.worlds = levels, split, float(step_cost), worlds
        self.system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.world: World | None = None
        self.turns = 0
        self.tools = _tools(self)
        kwargs.setdefault("max_calls_per_turn", 1)
        super().__init__(**kwargs)

    # ---------------------------------------------------------------- ToolEnv hooks
    def sample_task(self, rng: np.random.Generator, options: dict) -> dict:
        levels = self.difficulty
        level = int(options.get("difficulty", levels[int(rng.integers(len(levels)))]))
        split = options.get("split", self.split)
        seed = int(rng.integers(2**62))
        if self.worlds:
            seed %= self.worlds
        world = generate_world(seed, level, split)
        return {"id": world.task_id, "seed": seed, "difficulty": level, "split": split, "goal": world.goal_text()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        obs, info = super().reset(seed=seed, options=options)
        task = self._task
        try:
            self.world = generate_world(int(task["seed"]), int(task["difficulty"]), str(task["split"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"TextWorld task must hold seed, difficulty and split, got {task!r:.200}: {e}") from e
        self.turns = 0
        return obs, info

    def initial_messages(self, task: dict) -> list[dict]:
        world = generate_world(int(task["seed"]), int(task["difficulty"]), str(task["split"]))
        messages = [{"role": "user", "content": world.look()}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    async def score(self, task: dict, final_text: str, transcript: list[dict]) -> float:
        return self._success_reward() if self.world is not None and self.world.goal_met() else 0.0

    async def astep(self, action: str):
        obs, reward, terminated, truncated, info = await super().astep(action)
        self.turns += 1
        if not terminated and self.world is not None and self.world.goal_met():
            self._done = True
            info.update(final=True, ended_by="goal")
            return obs, reward + self._success_reward(), True, False, info
        return obs, reward, terminated, truncated, info

    # ---------------------------------------------------------------- GiGPO / demonstrations
    def state_key(self) -> str:
        """Hash of the world state the next turn starts from (same state by any path, same key)."""
        if self.world is None:
            raise RuntimeError("state_key() before reset()")
        return self.world.state_key()

    def oracle_actions(self) -> list[Action]:
        """The oracle plan from the current state (see ``agentrl.envs.textworld.oracle``)."""
        if self.world is None:
            raise RuntimeError("oracle_actions() before reset()")
        return oracle_actions(self.world)

    def _success_reward(self) -> float:
        return max(0.0, 1.0 - self.step_cost * self.turns)
