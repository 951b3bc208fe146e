"""The jobs agentrl runs: ``run`` (training), ``rollout``, ``eval``, ``serve``; ``build`` makes every
engine, weight sync and env factory a job needs from its config."""
