"""The ``python`` tool: run a Python 3 program in a sandbox and return what it printed.

Owns: ``make_python_tool``. The program is fed to ``python3 -`` on stdin: no argv length limit
for a 10 MB program, and tracebacks say ``File "<stdin>"`` rather than a random temp path, so the
same code gives the same observation on every run. Does not: isolate anything itself (the
sandbox does, or does not).
"""

from __future__ import annotations

from agentrl.sandbox.factory import default_sandbox
from agentrl.tools.base import Tool
from agentrl.tools.episode_sandbox import Runner, format_exec_result

_FRESH = (
    "Run a Python 3 program and return its stdout and stderr. Nothing persists between calls: "
    "each call is a fresh process in a fresh directory, so print() what you need to see."
)
_SESSION = (
    "Run a Python 3 program and return its stdout and stderr. Each call is a fresh process, so "
    "variables do not persist, but files written in the working directory do."
)


def make_python_tool(
    sandbox: Runner | None = None, *, timeout_s: float = 5.0, python: str = "python3", name: str = "python"
) -> Tool:
    """A ``Tool`` named ``name`` running code through ``sandbox`` (a ``Sandbox``, a session or an
    ``EpisodeSandbox``; default: the shared local sandbox) with a ``timeout_s`` deadline per run.
    A program that times out is the model's mistake and comes back as ``TimeoutError: ...`` text;
    SandboxError propagates."""
    sb = sandbox if sandbox is not None else default_sandbox()

    async def python_tool(code: str) -> str:
        """Run a Python 3 program.

        Args:
            code: The complete program to run.
        """
        res = await sb.run([python, "-"], stdin=code.encode("utf-8", "surrogatepass"), timeout_s=timeout_s)
        return format_exec_result(res, timeout_s)

    return Tool(python_tool, name=name, description=_SESSION if getattr(sb, "persistent", False) else _FRESH)
