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
        'AGENTRL_RESULT (a path to write its result JSON, e.g. {"reward": 1.0}) in its environment; with an env '
        "that gives the agent files to work on (bash_fix), AGENTRL_WORKDIR names the directory holding them (in the "
        "sandbox: its current directory).",
    )
    isolation: Literal["sandbox", "host"] = doc(
        "sandbox",
        "proxy: where agent.command runs. 'sandbox': in the local sandbox (the same memory, process and file "
        "limits as the env's tool calls; a dedicated uid, its own pid, mount and network namespaces and a "
        "read-only view of the host's /usr, the trainer's Python and its packages and the command's script's "
        "directory, as far as this host allows: the run prints one line saying what holds), reaching nothing but "
        "its episode's endpoint; always the local sandbox, whatever backend the env uses (a Docker image cannot "
        "carry the trainer's Python packages). 'host': for trusted programs only: it runs on the host with your "
        "user's rights (your files, your network, the trainer's environment). agent.callable always runs in the "
        "trainer's process.",
    )
    files: list[str] = doc(
        [],
        "proxy, agent.isolation=sandbox: more host paths the program may read (read-only, at their own paths), "
        "e.g. its config files or the source directory of a package installed in editable mode; relative paths are "
        "to the current directory.",
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
        "an env that does not end the episode on it makes the episode truncated_turns, reward 0). An env that gives "
        "the agent files to work on (bash_fix) scores the files the program left instead (its check, in a fresh "
        "sandbox), whatever the final text.",
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
        if self.isolation not in ("sandbox", "host"):
            raise ConfigError(
                f"agent.isolation must be 'sandbox' (the default) or 'host' (trusted programs only), "
                f"got {self.isolation!r}"
            )
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
