"""`agentrl run` with on-policy distillation on the tiny model, on two-turn episodes (a follow-up
message between the turns: observation tokens, loss mask 0): pure ``--algo opd`` with the student
itself as teacher (reverse KL and gradient ~0), and OPD mixed into GRPO with a perturbed teacher in
an async run (staleness 1, packed micro-batches)."""

import asyncio
import json
import math

import agentrl
from agentrl.envs.base import AgentEnv, join_messages, new_stats


class TwoTurnEnv(AgentEnv):
    """Two turns: the first reply gets a follow-up user message, the second ends the episode with
    reward 1 - chars/40 (shorter scores higher, so GRPO has a signal)."""

    has_eval_split = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        msgs = [{"role": "user", "content": f"Say a number ({self.np_random.integers(100)})."}]
        return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": seed}}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            msgs = [{"role": "user", "content": "And another one, please."}]
            return join_messages(msgs), 0.0, False, False, {"messages": msgs, "tool_stats": new_stats()}
        reward = 1.0 - min(len(action), 40) / 40
        return "", reward, True, False, {"messages": [], "tool_stats": new_stats()}


agentrl.register("test/TwoTurn-v0", entry_point=TwoTurnEnv, override=True)

SETS = [
    "env.kwargs={}",
    "rollout.max_new_tokens=8",
    # a turn ends at any of these (kept whole): most replies of the random model end before their
    # token limit, so the episode goes on to its second turn instead of ending truncated
    'rollout.stop=[" ", "e", "a", "o", "t", "n", "i", "s", "r", "1", "0", "(", "{", "<", "_"]',
    "rollout.max_turns=2",
    "rollout.score_truncated=true",
    "rollout.group_size=4",
    "train.groups_per_step=2",
    "eval.num_tasks=0",
    "eval.env_kwargs={}",
    "trainer.lr=2e-2",
    "logging.tensorboard=false",
    "train.checkpoint_every=0",
]


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"train/' in line]


def _sampled_masks_have_gaps(out) -> bool:
    """Some trained trajectory has an observation (mask 0) between two sampled (mask 1) stretches."""
    for f in (out / "trajectories").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            mask = "".join(str(m) for m in json.loads(line)["loss_mask"]).strip("0")
            if "0" in mask:
                return True
    return False


def test_cli_opd_with_the_student_as_teacher_has_zero_kl_and_no_gradient(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    out = tmp_path / "run"
    sets = [*SETS, "train.max_staleness=0", f"algo.teacher={tiny_model_dir}"]
    args = ["run", "--env", "test/TwoTurn-v0", "--algo", "opd", "--model", str(tiny_model_dir), "--steps", "2"]
    res = CliRunner().invoke(app, [*args, "-o", str(out), "-q", *[a for kv in sets for a in ("--set", kv)]])
    assert res.exit_code == 0, res.output
    rows = _rows(out)
    assert len(rows) == 2
    for r in rows:
        assert r["rollout/turns_mean"] > 1.0
        assert abs(r["opd/reverse_kl"]) < 1e-5  # the teacher is the student: every token agrees
        assert r["train/grad_norm"] < 1e-5  # the advantage is 0 and so is the distillation term
        assert r["time/teacher_s"] > 0.0
        assert "opd_reverse_kl" not in json.dumps(r) and "train/teacher_s" not in r
    assert _sampled_masks_have_gaps(out)


def test_opd_mixed_into_grpo_with_a_perturbed_teacher_async(tiny_model_dir, tmp_path):
    from trainer_helpers import perturbed_copy

    from agentrl.config.schema import load_config
    from agentrl.jobs.run import Runner

    teacher = perturbed_copy(tiny_model_dir, tmp_path / "teacher", 0.3)
    out = tmp_path / "run"
    cfg = load_config(
        [],
        [
            *SETS,
            f"output_dir={out}",
            f"model.path={tiny_model_dir}",
            "env.id=test/TwoTurn-v0",
            "algo.name=grpo",
            "algo.opd_coef=0.5",
            f"algo.teacher={teacher}",
            "train.steps=2",
            "train.max_staleness=1",
            "trainer.batching=pack",
            "trainer.micro_batch_tokens=256",
        ],
    )
    asyncio.run(Runner(cfg, progress=False).run())
    rows = _rows(out)
    assert len(rows) == 2
    for r in rows:
        assert math.isfinite(r["opd/reverse_kl"]) and abs(r["opd/reverse_kl"]) > 1e-3
        assert r["time/teacher_s"] > 0.0 and math.isfinite(r["train/grad_norm"])
