"""The OpenAI-compatible app over an engine (OpenAI chat and completions, Anthropic Messages, OpenAI
Responses): :func:`agentrl.serving.app.build_app` over :class:`agentrl.serving.api.OpenAIAPI`.
`agentrl serve` (:mod:`agentrl.jobs.serve`) and the agent proxy (:mod:`agentrl.agents.proxy`) both
serve it."""
