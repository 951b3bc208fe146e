"""The supervised warm start: SFT on oracle demonstrations, chat data, the built-in default model
and the tiny models it is built from (``tiny_model``, locally, no download)."""
