"""An outside agent loop for `agentrl rollout/run --agent proxy`, written against the official
`openai` client only: it knows nothing of agentrl but the environment variables it is given.

Reads the task from AGENTRL_TASK (messages and tool schemas), talks to OPENAI_BASE_URL with
OPENAI_API_KEY, runs each `python` tool call itself in a subprocess and sends the output back as a
tool message, until the model answers without a tool call; writes {"final": text} to
AGENTRL_RESULT (the env scores it with agent.reward=env).

    agentrl rollout --agent proxy --set agent.command="python examples/agents/openai_loop.py" \
        --set agent.reward=env
"""

import json
import os
import subprocess
import sys

from openai import OpenAI

MAX_TURNS = int(os.environ.get("AGENT_MAX_TURNS", "4"))


def run_python(code: str) -> str:
    try:
        p = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "error: timed out after 10 s"
    return (p.stdout + p.stderr)[-2000:] or "(no output)"


def main() -> None:
    task = json.loads(os.environ["AGENTRL_TASK"])
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = client.models.list().data[0].id
    messages = list(task["messages"])
    final = ""
    for _ in range(MAX_TURNS):
        kwargs = {"tools": task["tools"]} if task.get("tools") else {}
        reply = client.chat.completions.create(model=model, messages=messages, **kwargs).choices[0]
        message = reply.message
        messages.append(message.model_dump(exclude_none=True))
        final = message.content or ""
        if not message.tool_calls or reply.finish_reason == "length":
            break
        for call in message.tool_calls:
            try:
                args = json.loads(call.function.arguments)
            except ValueError:
                args = {}
            out = (
                run_python(str(args.get("code", "")))
                if call.function.name == "python"
                else f"error: unknown tool {call.function.name!r}"
            )
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": out})
    with open(os.environ["AGENTRL_RESULT"], "w") as f:
        json.dump({"final": final, "turns": sum(m["role"] == "assistant" for m in messages)}, f)


if __name__ == "__main__":
    main()
