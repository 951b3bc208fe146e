"""An outside agent that rewrites its history: after each tool result it keeps only the task and the
latest tool exchange (earlier turns dropped), as context-managing agents do. Its episodes come back
as several trajectory segments (metric agent/split_trajectories). Same environment contract as
openai_loop.py; reports {"reward": 1.0} when it made at least two requests (a stand-in scorer)."""

import json
import os

from openai import OpenAI


def main() -> None:
    task = json.loads(os.environ["AGENTRL_TASK"])
    client = OpenAI()
    start = list(task["messages"])
    messages = list(start)
    requests = 0
    for turn in range(3):
        reply = client.chat.completions.create(model="agentrl-policy", messages=messages, max_tokens=24)
        requests += 1
        text = reply.choices[0].message.content or ""
        # forget everything but the task, then ask again about the last reply only
        messages = start + [
            {"role": "assistant", "content": text[:40] + f" (turn {turn})"},
            {"role": "user", "content": "Again, shorter."},
        ]
    print(json.dumps({"reward": 1.0 if requests >= 2 else 0.0}))


if __name__ == "__main__":
    main()
