"""On-policy distillation in the trainer: a frozen teacher scores the samples' own action tokens,
its reverse KL is reported over them only, and a teacher equal to the student gives no gradient."""

from __future__ import annotations

import dataclasses
import math

import pytest
from trainer_helpers import make_samples, perturbed_copy

from agentrl.errors import ConfigError
from agentrl.trainer import Trainer, TrainerConfig


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return str(build_model(tmp_path_factory.mktemp("opd-student"), hidden_size=64, num_layers=2))


@pytest.fixture(scope="module")
def teacher_dir(model_dir, tmp_path_factory):
    """The student with noise on every weight: same tokenizer, another distribution."""
    return perturbed_copy(model_dir, tmp_path_factory.mktemp("opd-teacher"), 0.05)


def opd_cfg(teacher: str, coef: float = 1.0, **kw) -> TrainerConfig:
    return TrainerConfig(lr=3e-3, opd_coef=coef, teacher_path=teacher, micro_batch_tokens=64, **kw)


def zero_adv(samples):
    return [dataclasses.replace(s, advantages=[0.0] * len(s.token_ids)) for s in samples]


def test_opd_needs_a_teacher():
    with pytest.raises(ConfigError, match=r"trainer.opd_coef: 1.0 .* trainer.teacher_path is null"):
        TrainerConfig(opd_coef=1.0).check()


def test_teacher_equal_to_student_gives_zero_kl_and_zero_gradient(model_dir):
    samples = zero_adv(make_samples(4))
    with Trainer(model_dir, opd_cfg(model_dir)) as t:
        m = t.train_step(samples)
    assert m["opd_reverse_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["grad_norm"] == pytest.approx(0.0, abs=1e-6)
    assert m["teacher_s"] > 0.0


@pytest.mark.parametrize("batching", ["pack", "pad"])
def test_reverse_kl_is_the_mean_over_action_tokens_only(model_dir, teacher_dir, batching):
    # multi-turn samples: prompt (0), reply (1), tool output (0), reply (1); the reported KL is the mean
    # of (student - teacher) logprob over the mask-1 tokens, whatever the teacher thinks of the rest
    samples = zero_adv(make_samples(5, seed=3))
    with Trainer(model_dir, opd_cfg(teacher_dir, batching=batching)) as t:
        student, teacher = t.logprobs(samples), t.teacher_logprobs(samples)
        m = t.train_step(samples)
    diffs = [s_ - t_ for s, ls, lt in zip(samples, student, teacher) for s_, t_, k in zip(ls, lt, s.loss_mask) if k]
    assert len(diffs) == sum(sum(s.loss_mask) for s in samples)
    assert math.isfinite(m["opd_reverse_kl"])
    assert m["opd_reverse_kl"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-5)
    assert m["grad_norm"] > 1e-4


def test_pure_distillation_lowers_the_reverse_kl(model_dir, teacher_dir):
    samples = zero_adv(make_samples(4, seed=1))
    with Trainer(model_dir, opd_cfg(teacher_dir)) as t:
        kls = [t.train_step(samples)["opd_reverse_kl"] for _ in range(6)]
    assert kls[-1] < kls[0] - 0.05, kls


def test_rl_loss_and_distillation_add(model_dir, teacher_dir):
    # loss = RL loss + coef * OPD term: the pg_loss is the RL part alone, loss the sum; on policy
    # (ratio 1 in value) the OPD term's value is the reverse KL itself
    samples = make_samples(4, seed=2, adv=[1.0, -1.0, 0.5, -0.5])
    with Trainer(model_dir, opd_cfg(teacher_dir, 0.5, loss_agg="token-mean", old_logprobs="current")) as t:
        m = t.train_step(samples)
    assert abs(m["opd_reverse_kl"]) > 1e-3
    assert m["loss"] == pytest.approx(m["pg_loss"] + 0.5 * m["opd_reverse_kl"], abs=1e-5)
