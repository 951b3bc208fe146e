"""agentrl: reinforcement learning for multi-turn, tool-calling LLM agents.

The top level exposes the Gymnasium-style env registry (``register``, ``make``) and the data
contract (``Trajectory``, ``Outcome``); everything else lives in its own module. Importing agentrl
is cheap: torch and transformers load only when an engine or model is built.
"""
from agentrl.registry import make, register, registered, spec
from agentrl.trajectory import Outcome, Trajectory

__version__ = "0.1.0"
__all__ = ["make", "register", "registered", "spec", "Outcome", "Trajectory", "__version__"]
