"""Rollout engines behind one interface (see :mod:`agentrl.engine.base`)."""

from agentrl.engine.base import Engine, Generation, SamplingParams

__all__ = ["Engine", "Generation", "SamplingParams"]
