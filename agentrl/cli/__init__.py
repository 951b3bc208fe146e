"""The ``agentrl`` command line: a thin typer shell over the jobs (``main`` is the entry point)."""

from agentrl.cli.main import app, main

__all__ = ["app", "main"]
