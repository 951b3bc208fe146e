"""The API dialects `agentrl serve` and the recording proxy speak besides OpenAI chat completions.

Each dialect is a thin adapter over the one chat core (:meth:`agentrl.serving.api.OpenAIAPI.chat`):
it translates its request to the core's chat form (messages + tools + sampling fields) and the
core's answer (:mod:`agentrl.serving.dialects.reply`) back to its own shapes, whole or streamed.

- :class:`AnthropicMessages`: Anthropic Messages, ``POST /v1/messages``;
- :class:`OpenAIResponses`: OpenAI Responses, ``POST /v1/responses`` (:class:`ResponseStore`);
- :mod:`agentrl.serving.dialects.request`: the chat body's common parts.
"""

from agentrl.serving.dialects.anthropic import AnthropicMessages
from agentrl.serving.dialects.reply import Reply, ToolCall, reply_events
from agentrl.serving.dialects.responses import OpenAIResponses, ResponseStore

__all__ = ["AnthropicMessages", "OpenAIResponses", "Reply", "ResponseStore", "ToolCall", "reply_events"]
