"""The ``agent:`` section of the run config: who runs an episode's agent loop.

Owns the AgentConfig dataclass (every field documented with ``doc()``) and its checks, kept beside
its user (:mod:`agentrl.agents.strategy`) so that the agents package needs nothing from the config
tree; the tree (``agentrl.config.schema``) re-exports it. Does not run programs or serve requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentrl.common.fields import doc
from agentrl.errors import ConfigError


@dataclass
class AgentConfig:
    kind: Literal["builtin", "proxy"] = doc(
        "builtin",
        "Who runs the agent loop. 'builtin': the episode manager's own turn loop (render -> sample -> "
        "env.step). 'proxy': an outside agent program (agent.command or agent.callable) talks to the policy "
        "through a recording endpoint (OpenAI chat completions, Anthropic Messages /v1/messages, OpenAI Responses "
        "/v1/responses); every completion is recorded token-exact.",
    )
    command: str | None = doc(
        None,
        "proxy: a shell command run once per episode (training and held-out eval alike), e.g. "
        "'python examples/agents/openai_loop.py'. It gets "
        "OPENAI_BASE_URL, OPENAI_API_KEY (per episode; the same as ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY for the "
        "anthropic client), AGENTRL_TASK (the task as JSON: messages, tools, task) and "
        'AGENTRL_RESULT (a path to write its result JSON, e.g. {"reward": 1.0}) in its environment.',
    )
    callable: str | None = doc(
        None,
        "proxy: 'module:function' called once per episode instead of a command, as "
        "fn(task, base_url=..., api_key=...) (sync functions run in a thread; async ones on the run's loop); "
        "its return value (a dict, or None) is the result.",
    )
    timeout_s: float = doc(
        600.0,
        "proxy: wall-clock limit of one episode's agent program; past it the program is "
        "killed and the episode ends as 'deadline' (not trained).",
        min=0.001,
    )
    reward: Literal["program", "env"] = doc(
        "program",
        "proxy: where the reward comes from. 'program': the result's 'reward' (the AGENTRL_RESULT file, "
        "else the last JSON line of stdout, or the callable's return value); none is outcome 'reward_error'. "
        "'env': the env scores the episode's final assistant text (env.step on it, e.g. code_exec's answer check; "
        "an env that does not end the episode on it makes the episode truncated_turns, reward 0).",
    )
    model_name: str = doc(
        "agentrl-policy",
        "proxy: the model name the endpoint serves (requests naming another model are refused; set it to the "
        "name a harness asks for, e.g. an Anthropic model id).",
    )

    def __post_init__(self) -> None:
        if self.kind not in ("builtin", "proxy"):
            raise ConfigError(f"agent.kind must be 'builtin' or 'proxy', got {self.kind!r}")
        if self.reward not in ("program", "env"):
            raise ConfigError(f"agent.reward must be 'program' or 'env', got {self.reward!r}")
        if self.kind != "proxy":
            return
        if bool(self.command) == bool(self.callable):
            raise ConfigError(
                "agent.kind=proxy needs exactly one of agent.command (a shell command) or agent.callable "
                f"('module:function'), got command={self.command!r}, callable={self.callable!r}"
            )
        if self.callable:
            module, _, name = self.callable.partition(":")
            if not module or not name:
                raise ConfigError(f"agent.callable must be 'module:function', got {self.callable!r}")
