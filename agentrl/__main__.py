"""``python -m agentrl ...`` runs the ``agentrl`` command line."""
from agentrl.cli import main

main()
