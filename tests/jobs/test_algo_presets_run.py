"""`agentrl run` end to end on the tiny model with the presets of issue #16 (dapo, gspo, cispo,
reinforce_pp_baseline, and reinforce_pp with its KL in the reward), and DAPO's dynamic sampling
keeping the prompt stream exactly once through a resume."""

import asyncio
import json
import math

import pytest

import agentrl
from agentrl.batches.ledger import read_ledger
from agentrl.batches.staleness import load_ready
from agentrl.config.schema import load_config
from agentrl.envs.base import AgentEnv, join_messages, new_stats
from agentrl.jobs.run import Runner


class EveryThirdConstEnv(AgentEnv):
    """One turn; tasks whose seed is a multiple of 3 score 0.5 whatever is said (a group with no
    signal: dynamic sampling must filter it), the others 1 - chars/40 (varies across samples)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.const = seed % 3 == 0
        msgs = [{"role": "user", "content": f"Say a number ({seed})."}]
        return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": seed}}

    def step(self, action):
        reward = 0.5 if self.const else 1.0 - min(len(action), 40) / 40
        return "", reward, True, False, {"messages": [], "tool_stats": new_stats()}


agentrl.register("test/EveryThirdConst-v0", entry_point=EveryThirdConstEnv, override=True)


def _cfg(model_dir, out, algo, steps, extra=()):
    return load_config(
        [],
        [
            f"output_dir={out}",
            f"model.path={model_dir}",
            "env.id=test/EveryThirdConst-v0",
            "env.kwargs={}",
            f"algo.name={algo}",
            "rollout.max_new_tokens=6",
            "rollout.max_turns=1",
            "rollout.score_truncated=true",
            "rollout.group_size=4",
            "train.groups_per_step=3",
            f"train.steps={steps}",
            "train.max_staleness=0",
            "train.checkpoint_every=2",
            "eval.num_tasks=0",
            "eval.env_kwargs={}",
            "trainer.lr=2e-2",
            "logging.tensorboard=false",
            *extra,
        ],
    )


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _run(cfg):
    return asyncio.run(Runner(cfg, progress=False).run())


@pytest.mark.parametrize(
    "algo, needs",
    [
        ("gspo", "train/clipfrac"),
        ("cispo", "train/clipfrac"),
        ("reinforce_pp_baseline", "train/loss"),
        ("reinforce_pp", "credit/kl_in_reward/kl_mean"),
    ],
)
def test_preset_runs_end_to_end(tiny_model_dir, tmp_path, algo, needs):
    out = tmp_path / algo
    summary = _run(_cfg(tiny_model_dir, out, algo, 2))
    assert summary["steps"] == 2 and summary["algo"] == algo
    rows = [r for r in _rows(out) if "train/loss" in r]
    assert len(rows) == 2 and all(math.isfinite(r["train/loss"]) and needs in r for r in rows)
    if algo == "reinforce_pp":  # the reference model was loaded and the KL entered the reward
        assert all(r["credit/kl_in_reward/coef"] == 0.001 for r in rows)
        assert rows[0]["credit/kl_in_reward/kl_mean"] == pytest.approx(0.0, abs=1e-4)  # policy = reference
        assert abs(rows[1]["credit/kl_in_reward/kl_mean"]) > 1e-4  # one update later they differ


def _exactly_once(out, ckpt):
    """Every prompt position below the stream's next is trained once, filtered once, or outstanding
    (requeued or kept ready in the checkpoint), and no position twice."""
    state = json.loads((ckpt / "trainer_state.json").read_text())["extra"]
    ledger = read_ledger(out)
    trained = [p for r in ledger for p in r["positions"]]
    filtered = [p for r in ledger for p in r.get("filtered", [])]
    ready = [p for p, _ in load_ready(ckpt / "rollouts.jsonl")]
    seen = trained + filtered + state["stream"]["requeued"] + ready + state["stream"]["abandoned"]
    assert sorted(seen) == list(range(state["stream"]["next"])), (trained, filtered, state["stream"], ready)
    return trained, filtered


def test_dapo_filters_no_signal_groups_and_resumes_exactly_once(tiny_model_dir, tmp_path):
    out = tmp_path / "dapo"
    _run(_cfg(tiny_model_dir, out, "dapo", 2))
    _exactly_once(out, out / "checkpoints" / "step_000002")
    summary = _run(_cfg(tiny_model_dir, out, "dapo", 4, ["train.resume=true"]))
    assert summary["steps"] == 4
    trained, filtered = _exactly_once(out, out / "checkpoints" / "step_000004")
    assert filtered and all(p % 3 == 0 for p in filtered)  # rollout.seed=0: task seed = position
    assert not [p for p in trained if p % 3 == 0]  # no constant-reward group was trained
    rows = [r for r in _rows(out) if "dapo/filtered_groups" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r["dapo/filtered_groups"] for r in rows) == len(filtered)
    assert all(r["dapo/drawn_groups"] == r["dapo/filtered_groups"] + 3 for r in rows)  # full batches of 3
    assert all("credit/overlong/penalty_mean" in r for r in rows)  # the soft overlong punishment ran
    config = (out / "config.yaml").read_text()
    assert "clip_high: 0.28" in config and "dynamic_sampling: true" in config


def test_adaptive_kl_in_reward_moves_and_is_checkpointed(tiny_model_dir, tmp_path):
    out = tmp_path / "rpp"
    _run(_cfg(tiny_model_dir, out, "reinforce_pp", 2, ["algo.kl_target=1.0", "algo.kl_horizon=10"]))
    rows = [r for r in _rows(out) if "train/loss" in r]
    # step 1's KL (~0: policy = reference) is far below the target: e = -0.2, n = 12 samples, horizon 10
    want = 0.001 * (1 - 0.2 * 12 / 10)
    assert rows[0]["credit/kl_in_reward/coef"] == 0.001 and rows[1]["credit/kl_in_reward/coef"] == pytest.approx(want)
    extra = json.loads((out / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["extra"]
    err = min(max(rows[1]["credit/kl_in_reward/kl_mean"] / 1.0 - 1, -0.2), 0.2)
    assert extra["kl_in_reward"] == pytest.approx(want * (1 + err * 12 / 10))  # a resume starts from it
