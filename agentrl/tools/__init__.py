"""Tools: the typed ``Tool`` base (``base``), tool-call parsing (``calls``), the built-in ``python`` and
``bash`` tools and what they run through (``episode_sandbox``). Re-exports; the built-in tool factories
load lazily so that ``import agentrl.tools`` stays cheap."""

from agentrl.tools.episode_sandbox import EpisodeSandbox, format_exec_result


def __getattr__(name: str):
    if name == "make_python_tool":
        from agentrl.tools.python import make_python_tool  # lazy re-export: pulls in pydantic

        return make_python_tool
    if name == "make_bash_tool":
        from agentrl.tools.bash import make_bash_tool  # lazy re-export: pulls in pydantic

        return make_bash_tool
    raise AttributeError(name)


__all__ = ["EpisodeSandbox", "format_exec_result", "make_python_tool", "make_bash_tool"]
