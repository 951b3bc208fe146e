"""Every exception agentrl raises on purpose, in one place.

Hierarchy::

    AgentRLError
    ├── ConfigError            bad config key or value (names the field and the value)
    ├── RegistryError          unknown env id, bad entry point, duplicate registration
    ├── DatasetError           a dataset file or row that cannot be used (names file and row)
    ├── TemplateError          a chat template that breaks token-exact multi-turn rendering
    ├── CheckpointError        a checkpoint cannot be written (disk full) or read (a file missing),
    │                          or none can be resumed from
    ├── InfraFailureError      every episode of a run's first eval or step failed for the same
    │                          infrastructure reason: the run stops instead of "finishing"
    ├── DemonstrationError     oracle demonstrations of the SFT warm start failed their checks
    │                          (names the first: its task, the check, the tool's output; how many)
    ├── NodeLostError          a Ray node or actor of a run died mid-run (names it); the run
    │                          restarts from its checkpoint when ray.restart_on_node_loss allows
    └── EpisodeError           something that ends one episode; carries the typed Outcome
        ├── EngineError        the engine failed or is down           -> Outcome.ENGINE_ERROR
        ├── EnvError           the env (or a tool's own code) crashed -> Outcome.ENV_ERROR
        ├── ToolTimeoutError   a tool call passed its deadline        -> Outcome.TOOL_TIMEOUT
        ├── SandboxError       the sandbox died or refused to run     -> Outcome.SANDBOX_ERROR
        └── RewardError        the reward function failed             -> Outcome.REWARD_ERROR

    ToolCallError              NOT an infrastructure failure: the model called a tool badly
                               (malformed JSON, unknown tool, bad arguments). Its message goes
                               back to the model as the tool's answer and the episode goes on.

Infrastructure errors (EpisodeError subclasses) end the episode with their outcome, and such
episodes are excluded from the loss and counted; they are never scored as reward 0.
"""

from __future__ import annotations


class AgentRLError(Exception):
    """Base class of every error agentrl raises on purpose."""


class ConfigError(AgentRLError, ValueError):
    """A config key or value is invalid; the message names the field and the bad value."""


class RegistryError(AgentRLError, KeyError):
    """Unknown env id, unloadable entry point or conflicting registration."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class DatasetError(AgentRLError, ValueError):
    """A dataset file or row cannot be used; the message names the file and the row."""


class TemplateError(AgentRLError, ValueError):
    """A chat template cannot be used for token-exact multi-turn rendering."""


class CheckpointError(AgentRLError):
    """A checkpoint save failed (out of space: said so), a checkpoint lacks a file loading it needs, or
    ``--resume`` found no usable checkpoint."""


class InfraFailureError(AgentRLError):
    """Every episode failed with the same infrastructure outcome; the message names it and an example."""


class DemonstrationError(AgentRLError):
    """Oracle SFT demonstrations failed (the sandbox, the template's tool format, or the tasks): the
    message says how many of how many, and which check the first failing one failed, with its task."""


class NodeLostError(AgentRLError):
    """A Ray node (or an actor on it) of a ``distributed: ray`` run died; names the node and its actors."""


class EpisodeError(AgentRLError):
    """Ends one episode with a typed outcome; never propagates past the episode manager."""

    outcome: str = "env_error"


class EngineError(EpisodeError):
    outcome = "engine_error"


class EnvError(EpisodeError):
    outcome = "env_error"


class ToolTimeoutError(EpisodeError):
    outcome = "tool_timeout"


class SandboxError(EpisodeError):
    outcome = "sandbox_error"


class RewardError(EpisodeError):
    outcome = "reward_error"


class ToolCallError(AgentRLError):
    """The model called a tool badly. The message is shown to the model as the tool result."""

    def __init__(self, message: str, kind: str = "bad_arguments") -> None:
        super().__init__(message)
        #: one of "malformed", "unknown_tool", "bad_arguments" (counted in metrics)
        self.kind = kind
