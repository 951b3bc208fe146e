"""Model files and placement: resolving a model reference (a local directory or a Hugging Face Hub
id) to a checked local HF directory (``hub``, ``local_dir``), and choosing the device and dtype a model
runs on (``device``)."""
