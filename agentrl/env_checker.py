"""Old path of :mod:`agentrl.envs.checker`, kept for one release."""

from agentrl.common.moved import forward

forward(__name__, "agentrl.envs.checker")
