"""SFT warm start: token-exact oracle demonstrations, chat JSONL loading, a short real SFT run."""

from __future__ import annotations

import asyncio
import json

import pytest
from token_spans import mask_spans

from agentrl.envs import tasks
from agentrl.episodes.chat import ChatRenderer
from agentrl.errors import DatasetError
from agentrl.sandbox.subprocess_runner import SubprocessSandbox
from agentrl.warmstart import chat_data, sft

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sandbox():
    return SubprocessSandbox()


@pytest.mark.parametrize("parser", ["hermes", "python_block"])
def test_demonstrations_are_token_exact(tiny_tokenizer, sandbox, parser):
    tok = tiny_tokenizer
    todo = [tasks.generate_task(s, d, "train") for d in tasks.DIFFICULTIES for s in range(2)]
    kw = {"sandbox": sandbox, "parser": parser}
    trajs = asyncio.run(sft.make_demonstrations(tok, todo, env_kwargs=kw))
    assert len(trajs) == len(todo)  # every oracle episode succeeds (reward 1, outcome ok)
    for task, traj in zip(todo, trajs):  # in task order (two function tasks share a prompt and an id)
        traj.validate()
        assert traj.task["id"] == task["id"]
        assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
        # the whole sequence is exactly the template's rendering of the conversation
        r = ChatRenderer(tok, tools=sft_tools(parser))
        assert tok.decode(traj.token_ids) + r.glue == r.render(traj.messages)
        # mask 1 = exactly the two demonstrated turns, each closed by the end-of-turn token
        observation = traj.messages[3]["content"]
        want = [sft.oracle_turn(task, 0, None, parser), sft.oracle_turn(task, 1, observation, parser)]
        spans = mask_spans(traj.token_ids, traj.loss_mask)
        assert [tok.decode(s) for s in spans] == [w + "<|im_end|>" for w in want]
        assert traj.token_ids[: traj.prompt_len] == r.prompt_ids(traj.messages[:2])
        if task["answer"] is not None:
            assert observation == task["answer"]  # the real tool ran the reference solution


def sft_tools(parser):
    from agentrl.envs.registry import make

    env = make("code_exec", parser=parser, sandbox=SubprocessSandbox())
    try:
        return env.toolset.schemas()
    finally:
        env.close()


CHAT = {
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 6 * 7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "python", "arguments": '{"code": "print(6 * 7)"}'}}
            ],
        },
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "It is \\boxed{42}."},
        {"role": "user", "content": "And 1 + 1?"},
        {"role": "assistant", "content": "2"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "python",
                "description": "Run code.",
                "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
            },
        }
    ],
}


def test_chat_example_masks_exactly_the_assistant_turns(tiny_tokenizer):
    tok = tiny_tokenizer
    messages, tools = chat_data._check_row(json.loads(json.dumps(CHAT)), "x")
    ex = chat_data.chat_example(tok, messages, tools, "x")
    assert len(ex.token_ids) == len(ex.loss_mask) and ex.loss_mask[0] == 0
    r = ChatRenderer(tok, tools=tools)
    assert tok.decode(ex.token_ids) + r.glue == r.render(messages)
    spans = [tok.decode(s) for s in mask_spans(ex.token_ids, ex.loss_mask)]
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
    assert spans == [call + "<|im_end|>", "It is \\boxed{42}.<|im_end|>", "2<|im_end|>"]


def _write(tmp_path, rows):
    p = tmp_path / "chat.jsonl"
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return p


@pytest.mark.parametrize(
    "bad, match",
    [
        ("{not json", "not valid JSON"),
        ({"msgs": []}, "unknown key"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "'role'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 3}]},
            "'content' must be a string",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"function": {"name": "python", "arguments": "{oops"}}],
                    },
                ]
            },
            "not JSON",
        ),
        ({"messages": CHAT["messages"], "tools": "python"}, "'tools' must be a list"),
    ],
)
def test_jsonl_loader_rejects_bad_rows_naming_file_and_row(tiny_tokenizer, tmp_path, bad, match):
    p = _write(tmp_path, [CHAT, "", bad])  # the bad row is line 3 (a blank line 2 is skipped)
    with pytest.raises(DatasetError, match=match) as e:
        chat_data.load_chat_jsonl(p, tiny_tokenizer)
    assert f"{p}: row 3" in str(e.value)


def test_jsonl_loader_reads_good_rows(tiny_tokenizer, tmp_path):
    rows = chat_data.load_chat_jsonl(_write(tmp_path, [CHAT, CHAT]), tiny_tokenizer)
    assert len(rows) == 2 and rows[0].token_ids == rows[1].token_ids and rows[0].num_target > 0
    with pytest.raises(DatasetError, match="no such file"):
        chat_data.load_chat_jsonl(tmp_path / "missing.jsonl", tiny_tokenizer)


def test_short_sft_lowers_the_loss_and_writes_a_loadable_model(tmp_path, sandbox):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.warmstart.tiny_model import build_model

    base = build_model(tmp_path / "base", hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64)
    data = _write(tmp_path, [CHAT])
    cfg = sft.build_sft_config(
        ["steps=12", "batch_size=4", "lr=1e-2", "warmup_steps=2", "num_demos=4", "difficulty=[1, 2]", "device=cpu"]
    )
    cfg.env_kwargs = {"sandbox": sandbox}
    losses = []
    summary = sft.run_sft(base, tmp_path / "out", cfg, data=[data], log=lambda s, m: losses.append(m["loss"]))
    assert summary["examples"] == 5 and summary["demonstrations"] == 4 and len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.7 * losses[0]
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert model.config.vocab_size == len(tok)


def test_sft_config_validation():
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown key"):
        sft.build_sft_config(["stepz=3"])
    with pytest.raises(ConfigError, match="sft.difficulty"):
        sft.build_sft_config(["difficulty=[9]"])
    with pytest.raises(ConfigError, match="sft.steps"):
        sft.build_sft_config(["steps=0"])


def test_sft_command_trains_on_user_data_and_names_a_bad_row(tmp_path):
    """`agentrl sft` end to end through the CLI: a good JSONL trains and writes a model; a bad
    row fails with exit code 2 and a message naming the file and row."""
    from typer.testing import CliRunner

    from agentrl.cli.main import app
    from agentrl.warmstart.tiny_model import build_model

    base = build_model(tmp_path / "base", hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64)
    good = _write(tmp_path, [CHAT, CHAT])
    res = CliRunner().invoke(
        app,
        [
            "sft",
            "--model",
            str(base),
            "--data",
            str(good),
            "--steps",
            "2",
            "-q",
            "--out",
            str(tmp_path / "out"),
            "--set",
            "batch_size=2",
            "--set",
            "device=cpu",
        ],
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "config.json").exists() and "examples" in res.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(CHAT) + "\n{oops\n")
    res = CliRunner().invoke(
        app, ["sft", "--model", str(base), "--data", str(bad), "--steps", "2", "-q", "--out", str(tmp_path / "out2")]
    )
    assert res.exit_code == 2 and "row 2" in res.output and not (tmp_path / "out2").exists()


def test_direct_demonstrations_answer_without_the_tool(tiny_tokenizer, sandbox):
    todo = sft.demo_tasks(40, [1, 2], seed=3, direct_frac=0.5)
    direct = [t for t in todo if t.get("direct")]
    assert 10 <= len(direct) <= 30 and sft.demo_tasks(40, [1, 2], seed=3, direct_frac=0.5) == todo  # seeded
    trajs = asyncio.run(
        sft.make_demonstrations(
            tiny_tokenizer, direct[:3] + [t for t in todo if not t.get("direct")][:2], env_kwargs={"sandbox": sandbox}
        )
    )
    roles = sorted(tuple(m["role"] for m in t.messages) for t in trajs)
    assert roles == [("system", "user", "assistant")] * 3 + [("system", "user", "assistant", "tool", "assistant")] * 2
    assert all(t.reward == 1.0 for t in trajs)


def test_oracle_sandbox_demonstrations_match_a_real_sandbox(tiny_tokenizer, sandbox):
    """The in-process OracleSandbox (used for speed) yields the very token ids and masks a real
    sandbox does on difficulties 1-4; it cannot grade difficulty 5 (unit tests run as a file), so
    those demonstrations fail loudly instead of being made wrong."""
    todo = [tasks.generate_task(s, d, "train") for d in (1, 2, 3, 4) for s in range(4)]

    def demos(sb, batch):
        trajs = asyncio.run(sft.make_demonstrations(tiny_tokenizer, batch, env_kwargs={"sandbox": sb}))
        return sorted((t.task["id"], t.token_ids, t.loss_mask) for t in trajs)

    real, oracle = demos(sandbox, todo), demos(sft.OracleSandbox(), todo)
    assert len(real) == len(todo) and oracle == real
    assert demos(sft.OracleSandbox(), [tasks.generate_task(0, 5, "train")]) == []  # dropped, never wrong


def test_sft_command_lists_its_fields():
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    res = CliRunner().invoke(app, ["sft", "--set", "help=1"], terminal_width=200)
    assert res.exit_code == 0 and "direct_frac" in res.output and "Optimizer steps." in res.output


def test_a_model_takes_the_pretrained_recipe_and_explicit_fields_win():
    from agentrl.cli.sft import builtin_recipe
    from agentrl.warmstart.config import PRETRAINED, SFTConfig, resolve

    cfg, said = resolve(SFTConfig(steps=30))
    assert (cfg.lr, cfg.steps, cfg.batch_size) == (PRETRAINED["lr"], 30, PRETRAINED["batch_size"])
    assert cfg.num_demos == 30 * PRETRAINED["batch_size"] and cfg.warmup_steps == 3 and cfg.log_every == 1
    assert "sft.lr=5e-05" in said and "sft.steps" not in said and "pretrained" in said
    assert resolve(cfg) == (cfg, "")  # nothing left to choose
    notes = []
    built = builtin_recipe({**vars(SFTConfig()), "lr": 1e-3}, notes.append)
    assert built["lr"] == 1e-3 and built["steps"] == 400 and built["num_demos"] == 4000
    assert built["micro_batch_tokens"] == 4096
    assert "sft.steps=400" in notes[0] and "sft.lr" not in notes[0] and "built-in" in notes[0]


def test_progress_lines_say_loss_tokens_per_second_and_elapsed():
    from agentrl.warmstart.progress import sft_progress

    now, lines = [0.0], []
    log = sft_progress("sft", 10, every=4, min_interval_s=60, out=lines.append, clock=lambda: now[0])
    for step in range(1, 11):
        now[0] += 10 if step != 6 else 100  # step 6 is slow: its line comes from the minute rule
        log(step, {"loss": float(step), "tokens": 500})
    assert [line.split(",")[1].strip() for line in lines] == [
        "step 1/10", "step 4/10", "step 6/10", "step 8/10", "step 10/10"
    ]  # fmt: skip
    assert lines[0] == "sft, step 1/10, loss 1.000, 50 trained tokens/s, 10s elapsed"
    assert lines[1] == "sft, step 4/10, loss 3.000, 50 trained tokens/s, 40s elapsed"
    assert lines[2].endswith("loss 5.500, 9 trained tokens/s, 2m30s elapsed")


def test_sft_command_on_a_model_says_its_recipe_progress_and_failed_demonstrations(tmp_path, monkeypatch):
    """`agentrl sft --model DIR`: the pretrained recipe said at start, a line per step off a terminal,
    and failed demonstrations as one `error:` line (exit 2), not an internal error."""
    from typer.testing import CliRunner

    from agentrl.cli.main import app
    from agentrl.sandbox.base import ExecResult
    from agentrl.warmstart import demos
    from agentrl.warmstart.tiny_model import build_model

    base = build_model(tmp_path / "base", hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64)
    args = ["sft", "--model", str(base), "--steps", "2", "--set", "sft.batch_size=2", "--set", "sft.device=cpu"]
    res = CliRunner().invoke(app, [*args, "--set", "sft.log_every=1", "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "sft.lr=5e-05, sft.warmup_steps=0, sft.num_demos=4, sft.micro_batch_tokens=1024 (the recipe" in out
    assert "4 oracle demonstrations made and checked" in out
    assert "sft, step 1/2, loss" in out and "sft, step 2/2" in out and "trained tokens/s" in out

    async def broken(self, argv, *, stdin=None, timeout_s, files=None, **_):
        return ExecResult(stdout="", stderr="SyntaxError: boom", exit_code=1, status="ok", wall_s=0.0)

    monkeypatch.setattr(demos.OracleSandbox, "run", broken)
    res = CliRunner().invoke(app, [*args, "-q", "-o", str(tmp_path / "out2")])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "internal error" not in out, res.output
    assert "error: 4 of 4 oracle demonstrations failed their checks" in out and "SyntaxError: boom" in out
    assert not (tmp_path / "out2").exists()
