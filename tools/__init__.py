"""Built-in tools: ``python`` and ``bash``, each a ``Tool`` bound to a ``Sandbox``.

Owns: the tool factories (``make_python_tool``, ``make_bash_tool``) and how a sandbox result is
shown to the model (``format_exec_result``). Does not: parse calls, enforce the env's tool
deadline, or cap the length of what the env sends back (``ToolEnv`` does those).

The model's own failures (non-zero exit, its program timing out, too much output) are shown to
the model as text; only infrastructure failures (``SandboxError``) escape as exceptions.
"""
from __future__ import annotations

from agentrl.sandbox import ExecResult


def format_exec_result(res: ExecResult, timeout_s: float) -> str:
    """The text a model sees for one run: stdout, then stderr, then a status line when not clean."""
    parts = [p for p in (res.stdout, res.stderr) if p]
    text = "\n".join(p.rstrip("\n") for p in parts)
    notes = []
    if res.status == "timeout":
        notes.append(f"TimeoutError: the program did not finish within {timeout_s:g} s and was killed.")
    elif res.status == "output_limit":
        notes.append("[output limit exceeded: the program was killed; print less]")
    elif res.status == "oom":
        notes.append("MemoryError: the program ran out of memory and was killed.")
    elif res.status == "killed":
        notes.append(f"[the program was killed by signal {-(res.exit_code or 0)}]")
    elif res.status == "error":
        notes.append("[the sandbox reported an error running the program]")
    elif res.exit_code not in (0, None):
        notes.append(f"[exit code {res.exit_code}]")
    if res.truncated and res.status != "output_limit":
        notes.append("[output truncated]")
    if not text and not notes:
        return "(no output)"
    return "\n".join(([text] if text else []) + notes)


def __getattr__(name: str):
    # Lazy so that `import agentrl.tools` does not pull in the tooling machinery.
    if name == "make_python_tool":
        from agentrl.tools.python import make_python_tool

        return make_python_tool
    if name == "make_bash_tool":
        from agentrl.tools.bash import make_bash_tool

        return make_bash_tool
    raise AttributeError(name)


__all__ = ["format_exec_result", "make_python_tool", "make_bash_tool"]
