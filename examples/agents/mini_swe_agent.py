"""mini-swe-agent as the proxy's agent program: its own agent loop, model and environment classes,
unmodified (PyPI `mini-swe-agent` 2.x; `pip install mini-swe-agent`).

What it is: mini-swe-agent's `DefaultAgent` with its `LitellmModel` (litellm's chat completions with
one `bash` tool; the model answers with tool calls, which agentrl serves as Hermes tool calls) pointed
at the episode's endpoint, its `LocalEnvironment` running each command in a subshell of this process,
and its stock `mini.yaml` prompts (the ones its `mini` command uses). The task is the env's user prompt.
The agent ends by running `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (or at STEP_LIMIT model calls).

With `agent.isolation: sandbox` (the default) this program, and so every command the model writes,
runs inside the episode's sandbox, whose work dir holds the env's files (`AGENTRL_WORKDIR`, also the
current directory): the bash_fix env then checks the files the agent left there (`agent.reward=env`).

    agentrl run --env bash_fix --agent proxy --set agent.reward=env \\
        --set agent.command="python examples/agents/mini_swe_agent.py"

Environment: OPENAI_BASE_URL, OPENAI_API_KEY, AGENTRL_TASK, AGENTRL_RESULT (set by agentrl);
MSWEA_STEP_LIMIT (default 6) caps the model calls.

A model that never saw these prompts and this tool earns nothing here (the built-in model: 0 of 48
held-out tasks, so RL has no signal). Warm-start it first on demonstrations mini-swe-agent itself makes
against an oracle: ``mini_swe_agent_demos.py`` beside this file (its docstring has the commands). For the
built-in model that warm start teaches the reply format but not yet the commands (still 0 of 48:
BENCHMARKS.md, agent frameworks).
"""

import json
import os

# before importing mini-swe-agent / litellm: no banner, no model-price download (the sandbox has no
# network), no cost accounting for a model litellm does not know, no retries of a refused request
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")

import yaml  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import get_config_path  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

STEP_LIMIT = int(os.environ.get("MSWEA_STEP_LIMIT", "6"))
#: the command that ends mini-swe-agent's run (its stock mini.yaml asks for it; its local environment
#: submits when a command's output starts with this word)
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def build_agent(base_url: str, api_key: str, workdir: str, model_name: str = "agentrl-policy") -> DefaultAgent:
    """mini-swe-agent's DefaultAgent with its stock `mini.yaml` config, its litellm model on the
    endpoint (an OpenAI-compatible server: litellm's `openai/` provider) and its local environment in
    ``workdir``."""
    config = yaml.safe_load(get_config_path("mini").read_text())
    model = LitellmModel(
        model_name=f"openai/{model_name}",
        model_kwargs={**config["model"].get("model_kwargs", {}), "api_base": base_url, "api_key": api_key},
        **{k: v for k, v in config["model"].items() if k != "model_kwargs"},
    )
    env = LocalEnvironment(**{**config["environment"], "cwd": workdir})
    agent_cfg = {**config["agent"], "step_limit": STEP_LIMIT, "cost_limit": 0.0}
    return DefaultAgent(model, env, **agent_cfg)


def run(task: dict, *, base_url: str, api_key: str) -> dict:
    """One episode: the agent on the env's user prompt, its commands in the task's ``workdir`` (the
    current directory when there is none). Also an ``agent.callable`` (``mini_swe_agent:run``): in the
    trainer's process, its commands on the host -- for trusted models only, such as the oracle of
    ``mini_swe_agent_demos.py``."""
    prompt = next(m["content"] for m in reversed(task["messages"]) if m["role"] == "user")
    agent = build_agent(base_url, api_key, task.get("workdir") or os.getcwd())
    info = agent.run(prompt)
    return {"exit_status": info.get("exit_status"), "model_calls": agent.n_calls}


def main() -> None:
    task = json.loads(os.environ["AGENTRL_TASK"])
    if os.environ.get("AGENTRL_WORKDIR"):
        task["workdir"] = os.environ["AGENTRL_WORKDIR"]
    result = run(task, base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
    with open(os.environ["AGENTRL_RESULT"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
