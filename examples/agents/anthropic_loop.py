"""An outside agent loop for `agentrl run --agent proxy`, written against the official `anthropic`
client only (the Messages API: `messages.create` with tools, multi-turn `tool_use` / `tool_result`).

The loop (`run`): send the task's system prompt, messages and tools (converted to Anthropic's
`input_schema` shape), run each `python` `tool_use` itself (examples/agents/openai_loop.py's
`run_python`: this process's Python, `-I`, 10 s; with `agent.isolation: sandbox`, inside the episode's
sandbox) and answer with `tool_result` blocks, until the model stops without a `tool_use` or after
MAX_TURNS replies; the result is {"final": text, "turns": n} (the env scores the final text with
agent.reward=env).

As a command, one process per episode (ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY, AGENTRL_TASK and
AGENTRL_RESULT from agentrl; the model name the endpoint serves as its argument, default
agentrl-policy, agent.model_name's default):

    agentrl run --agent proxy --set agent.reward=env \\
        --set agent.command="python examples/agents/anthropic_loop.py"

or in-process (`run` as agent.callable: an async function on the run's loop):

    PYTHONPATH=examples/agents agentrl run --agent proxy --set agent.callable=anthropic_loop:run \\
        --set agent.reward=env
"""

import asyncio
import json
import os
import sys

from anthropic import AsyncAnthropic
from openai_loop import run_python  # the python tool of the openai example, beside this file

MAX_TURNS = int(os.environ.get("AGENT_MAX_TURNS", "4"))
MAX_TOKENS = 1024  # per reply; agentrl's rollout.max_new_tokens caps it anyway
REQUEST_TIMEOUT_S = 600.0


def anthropic_tools(tools: list[dict] | None) -> list[dict]:
    """OpenAI-style function schemas (the task's) as Anthropic tools."""
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"]["parameters"],
        }
        for t in tools or []
    ]


async def tool_result(use) -> dict:
    """The `tool_result` block answering one `tool_use` block (only `python` is known)."""
    code = use.input.get("code") if isinstance(use.input, dict) else None
    if use.name != "python":
        out, error = f"error: unknown tool {use.name!r}", True
    elif not isinstance(code, str):
        out, error = 'error: python takes {"code": "<program>"}', True
    else:
        out, error = await run_python(code), False
    return {"type": "tool_result", "tool_use_id": use.id, "content": out, "is_error": error}


async def run(
    task: dict, *, base_url: str | None = None, api_key: str | None = None, model: str = "agentrl-policy"
) -> dict:
    """One episode of ``task`` ({"messages": [...], "tools": [...] or None}) against the endpoint
    (``base_url``: the OpenAI-style URL ending in /v1 that agentrl hands a callable, or None for
    ANTHROPIC_BASE_URL)."""
    system = "\n".join(m["content"] for m in task["messages"] if m["role"] == "system")
    messages = [{"role": m["role"], "content": m["content"]} for m in task["messages"] if m["role"] != "system"]
    tools = anthropic_tools(task.get("tools"))
    extra = {"system": system} if system else {}
    if tools:
        extra["tools"] = tools
    final, turns = "", 0
    url = base_url.removesuffix("/v1") if base_url else None
    async with AsyncAnthropic(base_url=url, api_key=api_key, timeout=REQUEST_TIMEOUT_S) as client:
        for _ in range(MAX_TURNS):
            reply = await client.messages.create(model=model, max_tokens=MAX_TOKENS, messages=messages, **extra)
            turns += 1
            messages.append({"role": "assistant", "content": reply.content})
            final = "".join(b.text for b in reply.content if b.type == "text")
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses or reply.stop_reason != "tool_use":
                break
            messages.append({"role": "user", "content": [await tool_result(u) for u in uses]})
    return {"final": final, "turns": turns}


def main() -> None:
    task = json.loads(os.environ["AGENTRL_TASK"])
    model = sys.argv[1] if len(sys.argv) > 1 else "agentrl-policy"
    result = asyncio.run(run(task, model=model))  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
    with open(os.environ["AGENTRL_RESULT"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
