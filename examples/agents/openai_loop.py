"""An outside agent loop for `agentrl rollout/run --agent proxy`, written against the official
`openai` client only: it knows nothing of agentrl but the task it is given and the endpoint.

The loop (`run`): send the task's messages and tool schemas, run each `python` tool call itself in a
subprocess (this process's Python, `-I`, 10 s; not sandboxed: a toy agent's tool) and send the
output back as a tool message, until the model answers without a tool call or MAX_TURNS replies;
the result is {"final": text, "turns": n} (the env scores the final text with agent.reward=env).

Two ways to run it:

- as a command, one process per episode (task in AGENTRL_TASK, endpoint in OPENAI_BASE_URL and
  OPENAI_API_KEY, result written to AGENTRL_RESULT):

      agentrl run --agent proxy --set agent.command="python examples/agents/openai_loop.py" \
          --set agent.reward=env

- in-process, `run` as agent.callable (an async function on the run's event loop: no process per
  episode, one `openai.AsyncOpenAI` client per episode):

      PYTHONPATH=examples/agents agentrl run --agent proxy --set agent.callable=openai_loop:run \
          --set agent.reward=env
"""

import asyncio
import json
import os
import sys

from openai import AsyncOpenAI

MAX_TURNS = int(os.environ.get("AGENT_MAX_TURNS", "4"))
TOOL_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 600.0


async def run_python(code: str) -> str:
    """Run ``code`` in a fresh isolated-mode interpreter: its output (the tail, without the final
    newline), then ``[exit code N]`` when it failed -- the shape of code_exec's own python tool, which
    the built-in model was warm-started on."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-c",
        code,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TOOL_TIMEOUT_S)
    except TimeoutError:
        return f"error: timed out after {TOOL_TIMEOUT_S:g} s"
    finally:
        if proc.returncode is None:  # timed out, or the episode was cancelled: no orphan left behind
            proc.kill()
            await proc.wait()
    text = out.decode("utf-8", "replace")[-2000:].rstrip("\n")
    if proc.returncode:
        text += ("\n" if text else "") + f"[exit code {proc.returncode}]"
    return text or "(no output)"


async def call_tool(call) -> str:
    """The tool message content for one tool call (only `python` is known)."""
    if call.function.name != "python":
        return f"error: unknown tool {call.function.name!r}"
    try:
        args = json.loads(call.function.arguments)
    except ValueError:
        return "error: the arguments are not JSON"
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        return 'error: python takes {"code": "<program>"}'
    return await run_python(args["code"])


async def run(task: dict, *, base_url: str | None = None, api_key: str | None = None) -> dict:
    """One episode of ``task`` ({"messages": [...], "tools": [...] or None}) against the endpoint."""
    # one timeout for connecting too (the client's default connect timeout is 5 s): in-process, the
    # endpoint shares the event loop with the whole run, which a busy training step can hold for seconds
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=REQUEST_TIMEOUT_S) as client:
        model = (await client.models.list()).data[0].id
        messages = list(task["messages"])
        kwargs = {"tools": task["tools"]} if task.get("tools") else {}
        final, turns = "", 0
        for _ in range(MAX_TURNS):
            choice = (await client.chat.completions.create(model=model, messages=messages, **kwargs)).choices[0]
            message, turns = choice.message, turns + 1
            messages.append(message.model_dump(exclude_none=True))
            final = message.content or ""
            if not message.tool_calls or choice.finish_reason == "length":
                break
            for call in message.tool_calls:
                out = await call_tool(call)
                messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": out})
    return {"final": final, "turns": turns}


def main() -> None:
    task = json.loads(os.environ["AGENTRL_TASK"])
    result = asyncio.run(run(task))  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    with open(os.environ["AGENTRL_RESULT"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
