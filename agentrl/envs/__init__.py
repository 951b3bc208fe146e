"""Environments: the Gymnasium-style base classes (``base``), the registry (``registry``), the
conformance checker (``checker``), LLM-judge rewards (``judge``, ``judged``) and the built-in envs
(``code_exec``, ``concise``, ``noop`` with ``tasks``, ``datasets``, ``rewards``). Importing this
package registers the built-ins (``builtin``; entry points are strings, no env code runs)."""

from agentrl.envs import builtin  # noqa: F401  (registers the built-in envs)
