"""The SGLang engine: one or many SGLang servers driven over HTTP
(:class:`agentrl.engine.sglang.engine.SGLangEngine`)."""
