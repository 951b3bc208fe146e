"""Bring your own agent: outside agent loops train through a recording OpenAI-compatible endpoint
(``agent.kind: proxy``). Re-exports only."""

from agentrl.agents.config import AgentConfig
from agentrl.agents.proxy import ProxyEndpoint, RecordingEngine
from agentrl.agents.recorder import Recorder, Segment
from agentrl.agents.strategy import ProxyStrategy

__all__ = ["AgentConfig", "ProxyEndpoint", "ProxyStrategy", "RecordingEngine", "Recorder", "Segment"]
