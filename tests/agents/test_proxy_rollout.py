"""`agentrl rollout --agent proxy` end to end on code_exec with the built-in tiny model: an outside
agent written against the official `openai` client trains through the recording endpoint, and what
is recorded is exactly what the engine sampled."""

import json
import sys
from pathlib import Path

import probe_agents  # noqa: E402  (the official openai client, which litellm brings)
import pytest

import agentrl.jobs.rollout as rollout_job
from agentrl.config.schema import load_config
from agentrl.engine.base import Engine

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


class LoggingEngine(Engine):
    """Wraps the real engine; keeps (prompt, Generation) of every generate call."""

    def __init__(self, inner):
        self.inner, self.log = inner, []

    @property
    def policy_version(self):
        return self.inner.policy_version

    @property
    def max_context(self):
        return self.inner.max_context

    async def start(self):
        await self.inner.start()

    async def close(self):
        await self.inner.close()

    async def generate(self, prompt_ids, params, *, session=None):
        g = await self.inner.generate(prompt_ids, params, session=session)
        self.log.append((list(prompt_ids), g))
        return g


def _rollout(tmp_path, monkeypatch, script, extra=()):
    """A rollout whose agent is ``script`` (examples/agents) or, as "module:function", that callable."""
    engines = []
    real = rollout_job.make_engine

    def make_engine(cfg, model_path):
        engines.append(LoggingEngine(real(cfg, model_path)))
        return engines[-1]

    monkeypatch.setattr(rollout_job, "make_engine", make_engine)
    cfg = load_config(
        [],
        [
            f"output_dir={tmp_path}",
            "env.id=code_exec",
            "agent.kind=proxy",
            f"agent.callable={script}" if ":" in script else f"agent.command={sys.executable} {EXAMPLES / script}",
            "rollout.num_prompts=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=96",
            "rollout.max_turns=4",
            "agent.timeout_s=120",
            *extra,
        ],
    )
    trajs, metrics, _ = rollout_job.run_rollout(cfg, progress=False, note=lambda line: None)
    return trajs, engines[0].log


def _sampled_runs(t):
    """(start, ids, logprobs) of each sampled run of a trajectory."""
    return [
        (r.start, t.token_ids[r.start : r.start + r.n_sampled], t.logprobs[r.start : r.start + r.n_sampled])
        for r in t.turns
    ]


def _assert_token_exact(trajs, log):
    """Every sampled run of every trajectory is an engine sample after the exact prompt it was given;
    every engine sample is in one trajectory; the agents made tool calls and were never split."""
    by_prompt = {}
    for prompt, g in log:
        by_prompt.setdefault(tuple(prompt), []).append(g)
    recorded = 0
    for t in trajs:
        t.validate()
        assert t.outcome.value in ("ok", "truncated_length", "truncated_turns", "reward_error"), t.outcome_detail
        for start, ids, lps in _sampled_runs(t):
            gens = by_prompt[tuple(t.token_ids[:start])]  # the exact prompt the engine saw
            assert any(g.token_ids == ids and g.logprobs == lps for g in gens)
            recorded += 1
        assert all(v == -1 for v, m in zip(t.versions, t.loss_mask) if m == 0)
    assert recorded == len(log)  # every sampled completion is in exactly one trajectory
    multi = [t for t in trajs if t.num_turns > 1]
    assert multi, "the agent should have made a tool call and come back at least once"
    assert all(t.info["agent"]["splits"] == 0 for t in trajs)  # its own history was never re-tokenized


def test_openai_client_agent_is_recorded_token_exact(tmp_path, monkeypatch):
    trajs, log = _rollout(tmp_path, monkeypatch, "openai_loop.py", ["agent.reward=env"])
    assert len(log) >= 4 and len(trajs) >= 4
    _assert_token_exact(trajs, log)
    # the tools the agent's requests advertised (code_exec's python tool), kept for export-sft's rows
    assert all([f["function"]["name"] for f in t.tools] == ["python"] for t in trajs), [t.tools for t in trajs]


DIALECT_AGENTS = {
    # examples/agents/anthropic_loop.py, a sandboxed program asking for agent.model_name's default
    "messages": ("anthropic_loop.py", ["agent.reward=env"]),
    "responses": ("dialect_agents:responses_agent", ["agent.reward=env", "agent.model_name=policy"]),
}


@pytest.mark.parametrize("dialect", list(DIALECT_AGENTS))
def test_agents_on_the_other_dialects_are_recorded_token_exact(tmp_path, monkeypatch, dialect):
    """Agents written against `anthropic` (Messages) and `openai` (Responses, previous_response_id)."""
    script, sets = DIALECT_AGENTS[dialect]
    trajs, log = _rollout(tmp_path, monkeypatch, script, sets)
    assert len(trajs) == 4 and len(log) >= 4
    _assert_token_exact(trajs, log)


def test_a_history_rewriting_agent_yields_split_trajectories(tmp_path, monkeypatch):
    trajs, log = _rollout(tmp_path, monkeypatch, "forgetful_loop.py")
    finals = [t for t in trajs if "-seg" not in t.episode_id]
    segs = [t for t in trajs if "-seg" in t.episode_id]
    assert len(finals) == 4
    assert all(t.info["agent"]["splits"] == 2 and t.info["agent"]["segments"] == 3 for t in finals)
    assert len(segs) == 8 and len(log) == 12
    for t in trajs:
        t.validate()
        assert t.num_turns == 1 and t.reward == 1.0 and t.outcome.value == "ok"
        assert t.turns[-1].reward == 1.0


def test_a_crashing_agent_is_an_infrastructure_outcome(tmp_path, monkeypatch):
    tmp_path.chmod(0o755)  # the sandboxed program's own uid reads its script's directory
    bad = tmp_path / "crash.py"
    bad.write_text("import sys; sys.exit(3)\n")
    engines = []
    real = rollout_job.make_engine
    monkeypatch.setattr(rollout_job, "make_engine", lambda c, p: engines.append(real(c, p)) or engines[-1])
    cfg = load_config(
        [],
        [
            f"output_dir={tmp_path / 'out'}",
            "env.id=code_exec",
            "agent.kind=proxy",
            f"agent.command={sys.executable} {bad}",
            "rollout.num_prompts=1",
            "rollout.group_size=2",
        ],
    )
    trajs, metrics, _ = rollout_job.run_rollout(cfg, progress=False, note=lambda line: None)
    assert [t.outcome.value for t in trajs] == ["env_error", "env_error"]
    assert all("exited with code 3" in t.outcome_detail and not t.trainable for t in trajs)


def test_rollout_metrics_carry_the_agent_counters_and_the_endpoint_closes(tmp_path):
    probe_agents.URLS.clear()
    cfg = load_config(
        [],
        [
            f"output_dir={tmp_path / 'out'}",
            "env.id=code_exec",
            "agent.kind=proxy",
            "agent.callable=probe_agents:example_agent",
            "agent.reward=env",
            "rollout.num_prompts=1",
            "rollout.group_size=2",
            "rollout.max_new_tokens=96",
        ],
    )
    trajs, metrics, out = rollout_job.run_rollout(cfg, progress=False, note=lambda line: None)
    agent = json.loads((out / "metrics.json").read_text())["agent"]
    assert agent["episodes"] == len(probe_agents.URLS) == 2 and agent["program_crashes"] == 0, agent
    assert agent["requests"] == sum(t.info["agent"]["requests"] for t in trajs) >= 2, agent
    probe_agents.assert_closed(probe_agents.URLS[0])
