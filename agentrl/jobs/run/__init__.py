"""The main job, ``agentrl run``: :class:`Runner` (``agentrl.jobs.run.loop``) and the parts it drives."""

from agentrl.jobs.run.loop import Runner

__all__ = ["Runner"]
