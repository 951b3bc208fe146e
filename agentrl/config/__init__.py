"""One typed config tree for every agentrl command (``schema``: the dataclasses, loading, overrides)."""

from agentrl.config.schema import (
    AlgoConfig,
    EngineConfig,
    EnvConfig,
    EvalConfig,
    LoggingConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    TrainLoopConfig,
    field_docs,
    load_config,
    parse_override,
    save_config,
    to_dict,
)

__all__ = [
    "AlgoConfig",
    "EngineConfig",
    "EnvConfig",
    "EvalConfig",
    "LoggingConfig",
    "ModelConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainLoopConfig",
    "field_docs",
    "load_config",
    "parse_override",
    "save_config",
    "to_dict",
]
