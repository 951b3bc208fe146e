"""``python -m agentrl ...`` runs the ``agentrl`` command line."""

from agentrl.cli.main import main

main()
