"""Oracle demonstrations of an outside agent program: made by the real harness, in its own format.

Owns :func:`run_agent_demonstrations`: each task is one ``agent.kind: proxy`` episode -- the env's
reset (the task, its work dir), the agent program (``AgentConfig``: a command or a callable) talking to
a real recording endpoint (``ProxyStrategy`` over a ``ProxyEndpoint``), the env's score -- sampled
from a scripted ``FakeEngine``, the oracle, which answers the episode's k-th request with the k-th
assistant message of ``turns(task)`` (text and tool calls: the task's reference actions in the
harness's tool). The prompts, tool schemas and observations are the program's own, so a
demonstration holds what the model will see when it plays that program; ``agentrl export-sft`` turns
the kept trajectories into rows for ``agentrl sft --data``.

Each reply is the text the chat template writes for that assistant message (:func:`assistant_text`)
followed by its end-of-turn token, so a row re-rendered by the SFT loader gives back the recorded ids,
whatever the template. A demonstration is kept when it ended ``ok`` with reward 1 (for a workspace env,
the env's check of the files the program left) after the program asked for every scripted turn; the
others come back with the check they failed (:func:`check_agent_demo`).

Does not: know any harness or env (``turns`` does: ``examples/agents/mini_swe_agent_demos.py``),
write files or train (``agentrl.jobs.export_sft``, ``agentrl.warmstart.sft``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.agents.config import AgentConfig
from agentrl.agents.proxy import ProxyEndpoint
from agentrl.agents.strategy import ProxyStrategy
from agentrl.engine.fake import FakeEngine
from agentrl.episodes.chat import ChatRenderer
from agentrl.episodes.config import RolloutConfig
from agentrl.episodes.manager import EpisodeManager
from agentrl.episodes.spec import EpisodeSpec
from agentrl.errors import ConfigError, EngineError, TemplateError
from agentrl.warmstart.demos import DemoRun

_PROBE = [{"role": "user", "content": "."}]  # any conversation the assistant message can follow


def assistant_text(renderer: ChatRenderer, message: dict) -> str:
    """The text ``renderer``'s chat template writes for the assistant ``message`` (content and tool
    calls, OpenAI-style with ``arguments`` as an object) between its generation prompt and its
    end-of-turn token; TemplateError when the template does not render it that way."""
    if renderer.end_of_turn_id is None:
        raise TemplateError(renderer._turn_error or "the chat template has no end-of-turn token")
    eot = renderer.tokenizer.convert_ids_to_tokens(renderer.end_of_turn_id)
    before = renderer.render(_PROBE, add_generation_prompt=True)
    after = renderer.render([*_PROBE, message])
    tail = eot + renderer.glue
    if not after.startswith(before) or not after.endswith(tail):
        raise TemplateError(
            f"the chat template does not render an assistant message as generation prompt + text + {eot!r} "
            f"({after[len(before) - 20 :][:80]!r})"
        )
    return after[len(before) : len(after) - len(tail)]


def _session(i: int) -> str:
    # the episode manager's episode id for spec i (group "demo-i", sample 0): the session it samples under
    return f"demo-{i}-0"


def _oracle(scripts: dict[str, list[list[int]]]):
    """A FakeEngine policy: the episode by its session, the turn by counting that session's calls."""
    asked: dict[str, int] = {}

    def policy(prompt_ids, params, ctx):
        script = scripts.get(ctx.session or "")
        if script is None:
            raise EngineError(f"the oracle has no demonstration for session {ctx.session!r}")
        k = asked[ctx.session] = asked.get(ctx.session, -1) + 1
        if k >= len(script):
            raise EngineError(
                f"the agent program asked for turn {k + 1} of {ctx.session!r}; its oracle script has {len(script)}"
            )
        return script[k]

    return policy


def check_agent_demo(traj: Any, n_turns: int) -> str | None:
    """None when ``traj`` is a good demonstration of a ``n_turns``-turn script, else the check it
    failed, in words."""
    outcome = getattr(traj.outcome, "value", traj.outcome)
    agent = traj.info.get("agent", {})
    if outcome != "ok":
        return f"the episode ended {outcome}: {traj.outcome_detail[-300:]}"
    if agent.get("requests") != n_turns:
        return f"the agent program made {agent.get('requests')} requests, not the script's {n_turns}"
    if agent.get("segments") != 1:
        return f"the agent program rewrote its history ({agent.get('segments')} trajectories, not 1)"
    if traj.reward != 1.0:
        return f"the env scored the reference actions {traj.reward:g}, not 1 ({agent.get('check', '')})"
    return None


async def run_agent_demonstrations(
    tokenizer: Any,
    make_env: Callable[[], Any],
    tasks: list[dict],
    agent: AgentConfig,
    turns: Callable[[dict], list[dict]],
    *,
    env_id: str = "",
    max_concurrency: int = 16,
) -> DemoRun:
    """Oracle demonstrations of ``agent`` on ``tasks`` (module docstring): ``make_env()`` builds the env,
    ``turns(task)`` the assistant messages the oracle answers with, in order. The good trajectories in
    task order, and the failures as (task index, check failed)."""
    if agent.kind != "proxy":
        raise ConfigError(f"agent demonstrations run an agent program: agent.kind must be 'proxy', got {agent.kind!r}")
    renderer = ChatRenderer(tokenizer)
    end = renderer.end_of_turn_id
    if end is None:
        raise TemplateError(renderer._turn_error or "the chat template has no end-of-turn token")
    scripts = {
        _session(i): [renderer.encode(assistant_text(renderer, m)) + [end] for m in turns(t)]
        for i, t in enumerate(tasks)
    }
    engine = FakeEngine(_oracle(scripts), logprob=0.0)
    longest = max((len(ids) for script in scripts.values() for ids in script), default=1)
    cfg = RolloutConfig(
        max_turns=max((len(s) for s in scripts.values()), default=1),
        max_concurrency=max_concurrency,
        max_new_tokens=longest,
        max_context=1 << 20,
    )
    strategy = ProxyStrategy(agent, ProxyEndpoint(agent.model_name, max_tokens=longest))
    manager = EpisodeManager(engine, make_env, tokenizer, cfg, env_id=env_id, strategy=strategy)
    specs = [EpisodeSpec(f"demo-{i}", 0, i, options={"task": t}) for i, t in enumerate(tasks)]
    index = {_session(i): i for i in range(len(tasks))}
    try:
        trajs = [t for t in await manager.collect(specs) if t.episode_id in index]  # last segments only
    finally:
        await strategy.close()
    good, failed = [], []
    for traj in sorted(trajs, key=lambda t: index[t.episode_id]):
        i = index[traj.episode_id]
        why = check_agent_demo(traj, len(scripts[traj.episode_id]))
        if why is None:
            good.append(traj)
        else:
            failed.append((i, why))
    return DemoRun(good, failed)
