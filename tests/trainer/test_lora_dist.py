"""LoRA under FSDP2 on two processes (gloo on CPU, torchrun) matches one process, and runs end to end.

This file is also the worker: torchrun runs it as a script (see ``_worker``). The 2-process run
trains policy adapters and a LoRA critic (uneven micro-batch counts across ranks, from
tests/trainer_dist.py's batch), gathers merged weights and writes a checkpoint that one process resumes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from trainer_dist import batch, run, torchrun

from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer import lora as L
from agentrl.trainer.checkpoint import gather_model
from agentrl.trainer.config import LoraConfig

STEPS = 2


def config() -> TrainerConfig:
    return TrainerConfig(
        lr=1e-2,
        micro_batch_tokens=48,
        kl_coef=0.05,
        loss_agg="seq-mean-token-mean",
        critic_lr=1e-2,
        dist_timeout_s=120,
        lora=LoraConfig(rank=4, alpha=8.0, dropout=0.0),
    )


def _worker(model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    with Trainer(model_dir, config(), critic=True) as t:
        assert t.world == 2
        assert L.count_trainable(t.model) > 0
        res = run(t, STEPS)
        merged, adapters = t.full_state_dict(), gather_model(t.model)
        t.save(out / "ck")
        if t.rank == 0:
            torch.save(
                {"merged": merged, "adapters": {k: v for k, v in adapters.items() if L.is_adapter(k)}},
                out / "params.pt",
            )
            (out / "result.json").write_text(json.dumps(res))
        else:
            assert merged == {}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return str(build_model(tmp_path_factory.mktemp("lora-dist-model"), hidden_size=64, num_layers=2))


@pytest.mark.slow
def test_two_process_lora_matches_one_and_resumes(model_dir, tmp_path):
    torchrun(__file__, [model_dir, str(tmp_path)], "2-process LoRA run")
    two = json.loads((tmp_path / "result.json").read_text())
    p2 = torch.load(tmp_path / "params.pt")
    with Trainer(model_dir, config(), critic=True) as t:
        one = run(t, STEPS)
        merged1 = t.full_state_dict()
        adapters1 = {k: v for k, v in gather_model(t.model).items() if L.is_adapter(k)}
        t.train_step(batch(7))
        next1 = t.full_state_dict()
    # Adapters get a looser bound than merged weights: lora_B starts at 0, so lora_A's step-2 gradient is
    # ~lr-sized B times activations, near Adam's eps in places, where Adam turns the 2-process reduction's
    # fp32 rounding into up to ~1e-5 of A (1.45e-5 seen with transformers 5.24 / peft 0.21) while B @ A, the
    # merged weights, agree to < 1e-6. 1e-4 is 1 % of one lr-1e-2 step: a lost or misplaced shard update
    # still fails it.
    for a, b, tol in ((merged1, p2["merged"], 1e-5), (adapters1, p2["adapters"], 1e-4)):
        assert a.keys() == b.keys()
        assert max((a[k] - b[k]).abs().max().item() for k in a) < tol
    assert any(p2["adapters"][k].abs().max() > 0 for k in p2["adapters"] if ".lora_B." in k)  # adapters trained
    for m1, m2 in zip(one["metrics"], two["metrics"]):
        for k in ("loss", "pg_loss", "kl", "value_loss", "tokens"):
            assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-6), k
    for key in ("logprobs", "values"):
        worst = max(abs(a - b) for r1, r2 in zip(one[key], two[key]) for a, b in zip(r1, r2))
        assert worst < 1e-5, (key, worst)
    with Trainer(model_dir, config(), critic=True) as u:  # the 2-process checkpoint resumes in 1
        u.load(tmp_path / "ck")
        u.train_step(batch(7))
        resumed = u.full_state_dict()
    assert max((resumed[k] - next1[k]).abs().max().item() for k in resumed) < 1e-5


@pytest.mark.slow
def test_agentrl_run_with_lora_end_to_end(tiny_model_dir, tmp_path):
    """`agentrl run --set trainer.lora.rank=8` on a tiny model: trains, syncs merged weights to the
    engine every step, writes adapter checkpoints and a merged HF export."""
    import short_run  # noqa: F401  (registers test/Short-v0)
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    out = tmp_path / "run"
    sets = [
        f"model.path={tiny_model_dir}",
        "env.kwargs={}",
        "rollout.max_new_tokens=4",
        "rollout.max_turns=1",
        "rollout.group_size=4",
        "train.groups_per_step=2",
        "train.checkpoint_every=2",
        "eval.every=0",
        "eval.num_tasks=4",
        "eval.env_kwargs={}",
        "logging.tensorboard=false",
        "trainer.lora.rank=8",
        "trainer.lr=1e-2",
    ]
    args = ["run", "--env", "test/Short-v0", "--steps", "2", "--out", str(out), "--quiet"]
    for s in sets:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, (res.output[-3000:], res.exception)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(1 for r in rows if "rollout/reward_mean" in r) == 2
    ck = sorted((out / "checkpoints").glob("step_*/COMPLETE"))[-1].parent
    assert json.loads((ck / "trainer_state.json").read_text())["lora_rank"] == 8
    assert (ck / "adapter" / "adapter_model.safetensors").exists() and (ck / "model.safetensors").exists()


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
