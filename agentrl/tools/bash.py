"""The ``bash`` tool: run a bash script in a sandbox and return what it printed.

Owns: ``make_bash_tool``. The script is written to ``cmd.sh`` in the sandbox's working dir and run
with ``bash cmd.sh``. Does not: isolate anything itself (the sandbox does, or does not).
"""

from __future__ import annotations

from agentrl.sandbox.factory import default_sandbox
from agentrl.tools.base import Tool
from agentrl.tools.episode_sandbox import Runner, format_exec_result

_FRESH = "Run a bash script in a fresh working directory and return its stdout and stderr."
_SESSION = (
    "Run a bash script and return its stdout and stderr. Files in the working directory persist "
    "between calls; processes do not."
)


def make_bash_tool(sandbox: Runner | None = None, *, timeout_s: float = 5.0, name: str = "bash") -> Tool:
    """A ``Tool`` named ``name`` running bash through ``sandbox`` with a ``timeout_s`` deadline."""
    sb = sandbox if sandbox is not None else default_sandbox()

    async def bash_tool(command: str) -> str:
        """Run a bash script.

        Args:
            command: The bash commands to run.
        """
        res = await sb.run(
            ["bash", "cmd.sh"], files={"cmd.sh": command.encode("utf-8", "surrogatepass")}, timeout_s=timeout_s
        )
        return format_exec_result(res, timeout_s)

    return Tool(bash_tool, name=name, description=_SESSION if getattr(sb, "persistent", False) else _FRESH)
