"""`agentrl export-sft` (agentrl.jobs.export_sft): which stored episodes become chat rows, how tool calls are
written, and the round trip into `agentrl sft --data` — token-exact on a scripted episode, and through the
commands on the tiny model."""

import asyncio
import json

import pytest
from typer.testing import CliRunner

import agentrl
from agentrl.cli.main import app
from agentrl.config.schema import RolloutConfig
from agentrl.engine.fake import FakeEngine
from agentrl.envs.base import ToolEnv
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec
from agentrl.errors import DatasetError
from agentrl.jobs.export_sft import Stored, chat_row, export_sft, with_tool_calls
from agentrl.tools.base import Tool
from agentrl.trajectory import Outcome, Trajectory, write_jsonl
from agentrl.warmstart.chat_data import load_chat_jsonl

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "pi"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


class LookupEnv(ToolEnv):
    """Look a constant up with the `lookup` tool; the final answer is scored against its value."""

    def __init__(self, **kw):
        async def lookup(key: str) -> str:
            """The value of a named constant.

            Args:
                key: its name
            """
            return {"pi": "3.14"}.get(key, "unknown")

        self.tools = [Tool(lookup, name="lookup")]
        super().__init__(**kw)

    def sample_task(self, rng, options):
        return {"id": int(rng.integers(1000))}

    def initial_messages(self, task):
        return [{"role": "user", "content": f"Task {task['id']}: what is pi?"}]

    async def score(self, task, final_text, transcript):
        return float("3.14" in final_text)


agentrl.register("test/Lookup-v0", entry_point=LookupEnv, override=True)


def _traj(outcome="ok", reward=1.0, answer="3.14", **kw):
    msgs = [
        {"role": "user", "content": "what is pi?"},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "name": "lookup", "tool_call_id": "call_0", "content": "3.14"},
        {"role": "assistant", "content": answer},
    ]
    return Trajectory("e", "g", "test/Lookup-v0", 0, outcome=Outcome(outcome), reward=reward, messages=msgs, **kw)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------ filtering and counts
def test_only_ok_episodes_at_the_reward_bar_are_kept_and_the_rest_counted(tmp_path):
    trajs = [
        _traj(tools=TOOLS),
        _traj(tools=TOOLS),  # identical: a duplicate row with --dedupe
        _traj(reward=0.2, answer="3"),
        _traj("truncated_length", 0.0),
        _traj("engine_error", 0.0),
        _traj("sandbox_error", 0.0),
    ]
    write_jsonl(tmp_path / "trajectories.jsonl", trajs)
    counts = export_sft(tmp_path, tmp_path / "out" / "rows.jsonl", min_reward=0.5, dedupe=True)
    assert (counts.episodes, counts.kept) == (6, 1)
    assert counts.line() == (
        "kept 1 of 6 episodes; excluded: duplicate=1, infra engine_error=1, "
        "reward<0.5=1, infra sandbox_error=1, truncated_length=1"
    )
    (row,) = _rows(tmp_path / "out" / "rows.jsonl")
    assert row["tools"] == TOOLS and [m["role"] for m in row["messages"]] == ["user", "assistant", "tool", "assistant"]

    every_ok = export_sft(tmp_path / "trajectories.jsonl", tmp_path / "all.jsonl")  # no bar, no dedupe
    assert every_ok.kept == 3 and every_ok.line().startswith("kept 3 of 6 episodes; excluded: infra engine_error=1")


def test_a_run_directory_reads_every_step_file(tmp_path):
    (tmp_path / "trajectories").mkdir()
    write_jsonl(tmp_path / "trajectories" / "step_000001.jsonl", [_traj(), _traj("engine_error", 0.0)])
    write_jsonl(tmp_path / "trajectories" / "step_000002.jsonl", [_traj(reward=0.5)])
    counts = export_sft(tmp_path, tmp_path / "rows.jsonl")
    assert counts.line() == "kept 2 of 3 episodes; excluded: infra engine_error=1"


def test_bad_sources_are_named(tmp_path):
    with pytest.raises(DatasetError, match="no such file or directory"):
        export_sft(tmp_path / "missing", tmp_path / "rows.jsonl")
    with pytest.raises(DatasetError, match="no episodes here"):
        export_sft(tmp_path, tmp_path / "rows.jsonl")
    (tmp_path / "chat.jsonl").write_text('{"messages": []}\n')  # chat rows, not episodes
    with pytest.raises(DatasetError, match=r"chat.jsonl:1: not a trajectory or an eval episode"):
        export_sft(tmp_path / "chat.jsonl", tmp_path / "rows.jsonl")


# ------------------------------------------------------------------ tool calls
def test_hermes_calls_become_tool_calls_only_when_lossless():
    row = chat_row(Stored("x", "ok", 1.0, _traj().messages, TOOLS))
    call = row["messages"][1]
    assert call == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "pi"}'}}
        ],
    }
    answered = ["call_0"]
    for text in (
        CALL.replace('{"name"', '{ "name"'),  # the model's own spacing: the template would not give it back
        "```python\nprint(3.14)\n```",  # python_block: the env's format, kept as written
        '<tool_call>\n{"name": "lookup", "arguments": {"key": </tool_call>',  # malformed
    ):
        assert with_tool_calls({"role": "assistant", "content": text}, answered)["content"] == text
    assert "tool_calls" not in with_tool_calls({"role": "assistant", "content": CALL}, [])  # nothing answered it
    prose = with_tool_calls({"role": "assistant", "content": "Let me look.\n" + CALL}, answered)
    assert prose["content"] == "Let me look." and len(prose["tool_calls"]) == 1


def test_sft_loads_an_exported_episode_token_exact(tiny_tokenizer, tmp_path):
    """A scripted episode with a tool call on the Qwen2.5 template: the exported row, loaded by `agentrl
    sft --data`'s loader, is the trajectory's own ids with the same loss mask."""
    tok = tiny_tokenizer
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    turns = [CALL, "Pi is 3.14."]

    def policy(prompt_ids, params, ctx):
        return tok.encode(turns[ctx.call_index], add_special_tokens=False) + [eot]

    mgr = EpisodeManager(FakeEngine(policy), LookupEnv, tok, RolloutConfig(max_turns=4), env_id="test/Lookup-v0")
    traj = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, task_seed=1)))
    assert traj.outcome == Outcome.OK and traj.reward == 1.0, traj.outcome_detail
    assert [t["function"]["name"] for t in traj.tools] == ["lookup"]  # the advertised tools are stored
    write_jsonl(tmp_path / "trajectories.jsonl", [traj])
    export_sft(tmp_path, tmp_path / "rows.jsonl")
    (row,) = _rows(tmp_path / "rows.jsonl")
    assert row["messages"][1]["tool_calls"][0]["function"]["name"] == "lookup"
    (example,) = load_chat_jsonl(tmp_path / "rows.jsonl", tok)
    assert example.token_ids == traj.token_ids and example.loss_mask == traj.loss_mask


# ------------------------------------------------------------------ sources written by the commands
def test_an_eval_file_exports_its_ok_episodes(tmp_path):
    """The eval's episodes (and its chat file, which stands for them) are a source like trajectories."""
    from test_eval_resume import FakeClient

    from agentrl.jobs.eval import run_eval

    out = tmp_path / "ev.jsonl"
    asyncio.run(run_eval("test/Echo-v0", FakeClient(fail={2}), n=4, attempts=2, concurrency=1, seed=3, out=out))
    episodes = tmp_path / "ev.episodes.jsonl"
    solved = sum(json.loads(line)["reward"] == 1.0 for line in episodes.read_text().splitlines())
    counts = export_sft(out, tmp_path / "rows.jsonl", min_reward=1.0)
    assert counts.episodes == 8 and counts.kept == solved and counts.excluded["engine_error"] == 1
    assert all(r["messages"][-1] == {"role": "assistant", "content": "yes"} for r in _rows(tmp_path / "rows.jsonl"))
    assert export_sft(episodes, tmp_path / "same.jsonl", min_reward=1.0).line() == counts.line()


def test_rollout_export_sft_round_trip_on_the_tiny_model(tiny_model_dir, tmp_path):
    """`agentrl rollout` (the tiny model, stop strings so turns end) -> `agentrl export-sft` -> `agentrl sft
    --data` trains a step on the rows."""
    sets = [
        "rollout.max_new_tokens=12",
        "rollout.max_turns=1",
        'rollout.stop=["e", "a", "o", "i", " "]',
        "model.device=cpu",
    ]
    run = tmp_path / "rollout"
    args = ["rollout", "--env", "test/Lookup-v0", "--model", str(tiny_model_dir), "-n", "2", "-g", "2", "-o", str(run)]
    res = CliRunner().invoke(app, [*args, "-q", *(a for s in sets for a in ("--set", s))], terminal_width=200)
    assert res.exit_code == 0, res.output + repr(res.exception)

    rows = tmp_path / "rows.jsonl"
    res = CliRunner().invoke(app, ["export-sft", str(run), "-o", str(rows)], terminal_width=200)
    assert res.exit_code == 0, res.output
    kept = len(rows.read_text().splitlines())
    assert kept >= 1 and f"kept {kept} of 4 episodes" in res.output
    assert all(r["tools"][0]["function"]["name"] == "lookup" for r in _rows(rows))

    model_out = tmp_path / "sft"
    res = CliRunner().invoke(
        app,
        ["sft", "--model", str(tiny_model_dir), "--data", str(rows), "--steps", "1", "-o", str(model_out), "-q"]
        + ["--set", "sft.batch_size=2"],
        terminal_width=200,
    )
    assert res.exit_code == 0, res.output + repr(res.exception)
    table = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in res.output.splitlines() if "│" in line}
    assert table["examples"] == str(kept) and table["steps"] == "1" and (model_out / "config.json").exists()


def test_export_sft_command_refuses_config_and_names_a_bad_source(tmp_path):
    res = CliRunner().invoke(app, ["export-sft", str(tmp_path / "nope"), "-o", str(tmp_path / "r.jsonl")])
    assert res.exit_code == 2 and "nope: no such file or directory" in res.output
    res = CliRunner().invoke(app, ["export-sft", str(tmp_path), "-o", "r.jsonl", "--set", "a=1"])
    assert res.exit_code == 2 and "takes no config" in res.output
