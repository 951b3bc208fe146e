"""agentrl-countdown: the Countdown numbers game (``env``: ``CountdownEnv``) and the exact arithmetic it
scores with (``arith``). Importing it registers nothing: agentrl finds ``countdown/Countdown-v0`` through
the ``agentrl.envs`` entry point in this package's pyproject."""
