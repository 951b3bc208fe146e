"""Model files: checking that a local HF directory is a usable model (``local_dir``)."""
