"""Old path of :mod:`agentrl.tools.base`, kept for one release."""

from agentrl.common.moved import forward

forward(__name__, "agentrl.tools.base")
