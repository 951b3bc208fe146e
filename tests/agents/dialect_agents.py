"""Agent callables for the proxy-mode tests written against the other dialects' official clients
(``agent.callable=dialect_agents:NAME``): the example agent's loop (run each ``python`` call, send
the output back, until the model answers without a call) with the `openai` client on OpenAI
Responses (each turn continues the last through ``previous_response_id``). It returns {"final": text,
"turns": n}. The Anthropic Messages one is an example program (examples/agents/anthropic_loop.py)."""

import json

from openai import AsyncOpenAI
from probe_agents import openai_loop

MAX_TURNS = 4


async def _tool(name: str, args) -> str:
    """The tool message of one call (only ``python`` is known; arguments a dict or JSON text)."""
    if name != "python":
        return f"error: unknown tool {name!r}"
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return "error: the arguments are not JSON"
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        return 'error: python takes {"code": "<program>"}'
    return await openai_loop.run_python(args["code"])


async def responses_agent(task, *, base_url, api_key):
    """The loop on OpenAI Responses (``function_call`` items out, ``function_call_output`` back)."""
    system = "\n".join(m["content"] for m in task["messages"] if m["role"] == "system")
    items = [{"role": m["role"], "content": m["content"]} for m in task["messages"] if m["role"] != "system"]
    tools = [{"type": "function", **t["function"]} for t in task.get("tools") or []]
    final, turns, previous = "", 0, None
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600) as client:
        for _ in range(MAX_TURNS):
            turns += 1
            reply = await client.responses.create(
                model="policy", instructions=system, input=items, tools=tools, previous_response_id=previous
            )
            final, previous = reply.output_text, reply.id
            calls = [i for i in reply.output if i.type == "function_call"]
            if not calls or reply.status == "incomplete":
                break
            items = [
                {"type": "function_call_output", "call_id": c.call_id, "output": await _tool(c.name, c.arguments)}
                for c in calls
            ]
    return {"final": final, "turns": turns}
