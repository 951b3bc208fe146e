"""Model files and placement: resolving a model reference (a local directory or a Hugging Face Hub
id) to a checked local HF directory (``hub``, ``local_dir``), an on-policy distillation teacher to one
that shares the student's tokenizer (``teacher``), and choosing the device and dtype a model
runs on (``device``)."""
