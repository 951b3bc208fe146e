"""The program that runs INSIDE every sandbox container, as its pid 1: ``executor`` (the request loop)
and ``procs`` (reaping, killing, resetting the workspace). Standard library only: the host reads these
files (and ``agentrl/sandbox/files.py``) and passes them to the container's ``python3`` on the command
line (``agentrl.sandbox.docker.conn.executor_source``); nothing here is imported on the host."""
