"""The in-process engine: a transformers model decoding many sequences over one batched K/V cache
(:class:`agentrl.engine.local.engine.LocalEngine`)."""
