"""Warm-start data for mini-swe-agent on bash_fix, made by mini-swe-agent itself against an oracle.

Each bash_fix train task is one episode of ``mini_swe_agent.py`` (unmodified mini-swe-agent, its stock
``mini.yaml`` prompts and bash tool) through agentrl's recording proxy, sampled from an oracle that
answers mini-swe-agent's first request with a short thought and a ``bash`` tool call running the task's
reference solution, and its second with mini-swe-agent's submit command. The env's check scores the files
the commands left; the episodes it scores 1 are written to OUT/trajectories.jsonl, and ``agentrl
export-sft`` (the same code) turns them into OUT/sft.jsonl: chat rows holding mini-swe-agent's own system
and instance prompts, its bash tool schema and its observations -- what the model sees when it plays
mini-swe-agent in ``agentrl run --agent proxy``. Then the warm start and the run:

    python examples/agents/mini_swe_agent_demos.py -n 1000 -o runs/msa-demos
    agentrl sft --data runs/msa-demos/sft.jsonl --model MODEL --set sft.lr=2e-3 -o runs/msa-sft
    agentrl run --env bash_fix --agent proxy --set model.path=runs/msa-sft ... (BENCHMARKS.md)

mini-swe-agent runs in this process (``agent.callable=mini_swe_agent:run``: no sandbox), so the commands
it runs execute on the host, each episode in a fresh temporary directory holding the task's files; they
are the oracle's reference commands only. ``--model``: the model whose tokenizer renders the
demonstrations (the rows are text: any model with the same chat template trains on them); default the
built-in model, whose path (its code_exec warm start, the MODEL to fine-tune) the script prints.
"""

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # mini_swe_agent, for agent.callable

from mini_swe_agent import SUBMIT  # noqa: E402

from agentrl.agents.config import AgentConfig  # noqa: E402
from agentrl.envs import bash_tasks  # noqa: E402
from agentrl.envs.registry import make  # noqa: E402
from agentrl.envs.tasks import distinct_tasks  # noqa: E402
from agentrl.episodes.tokenizer import load_chat_tokenizer  # noqa: E402
from agentrl.jobs.export_sft import export_sft  # noqa: E402
from agentrl.trajectory import json_text  # noqa: E402
from agentrl.warmstart.agent_demos import run_agent_demonstrations  # noqa: E402
from agentrl.warmstart.default_model import resolve_model_path  # noqa: E402

THOUGHT = "This command does what the task asks."
DONE = "The task is done, so I submit."


def bash_call(content: str, command: str) -> dict:
    """An assistant message: ``content`` then one call of mini-swe-agent's ``bash`` tool."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": command}}}],
    }


def oracle_turns(task: dict) -> list[dict]:
    """The oracle's replies to mini-swe-agent on one bash_fix task: the reference solution, then submit."""
    return [bash_call(THOUGHT, task["solution"]), bash_call(DONE, SUBMIT)]


def train_tasks(n: int, seed: int = 0) -> list[dict]:
    """``n`` distinct bash_fix train-split tasks (never a held-out one), every kind."""
    return distinct_tasks(lambda s: bash_tasks.generate_task(s, "train"), n, seed=seed)


def make_demos(tokenizer, tasks: list[dict], *, sandbox_backend: str = "local", max_concurrency: int = 16):
    """Oracle demonstrations of mini-swe-agent on ``tasks``: ``DemoRun(good, failed)``."""
    agent = AgentConfig(kind="proxy", callable="mini_swe_agent:run", reward="env", isolation="host", timeout_s=120)
    return asyncio.run(
        run_agent_demonstrations(
            tokenizer,
            lambda: make("bash_fix", sandbox_backend=sandbox_backend),
            tasks,
            agent,
            oracle_turns,
            env_id="bash_fix",
            max_concurrency=max_concurrency,
        )
    )


def write_demos(out: Path, trajs: list) -> Path:
    """The trajectories as ``out/trajectories.jsonl`` (the file ``agentrl export-sft`` reads)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "trajectories.jsonl"
    path.write_text("".join(json_text(t.to_dict()) + "\n" for t in trajs), encoding="utf-8")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--num", type=int, default=1000, help="train tasks to demonstrate")
    p.add_argument("-o", "--out", required=True, help="directory for trajectories.jsonl and sft.jsonl")
    p.add_argument("--model", default=None, help="model whose tokenizer renders the demos (default: built-in)")
    p.add_argument("--seed", type=int, default=0, help="which train tasks")
    p.add_argument("--sandbox-backend", default="local", help="where bash_fix's check runs")
    p.add_argument("--concurrency", type=int, default=16, help="episodes at once")
    args = p.parse_args()
    model = resolve_model_path(args.model)  # None: the built-in model (its code_exec warm start)
    tokenizer, _ = load_chat_tokenizer(model)
    tasks = train_tasks(args.num, args.seed)
    t0 = time.perf_counter()
    run = make_demos(tokenizer, tasks, sandbox_backend=args.sandbox_backend, max_concurrency=args.concurrency)
    out = Path(args.out)
    write_demos(out, run.good)
    print(f"{len(run.good)} of {len(tasks)} demonstrations passed the check in {time.perf_counter() - t0:.0f} s")
    for i, why in run.failed[:5]:
        print(f"  failed: task {tasks[i]['id']} ({tasks[i]['kind']}): {why}")
    counts = export_sft(out, out / "sft.jsonl", min_reward=1.0)
    print(f"export-sft: {counts.line()}; wrote {out / 'sft.jsonl'}")
    print(f"next: agentrl sft --data {out / 'sft.jsonl'} --model {model} --set sft.lr=2e-3 -o OUT_MODEL")
    if run.failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
