"""Sequence-level policy losses in the trainer: the ``seq_index`` a loss like gspo asks for."""

from __future__ import annotations

import math

import pytest
from trainer_helpers import make_samples

from agentrl.trainer import Trainer, TrainerConfig


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return str(build_model(tmp_path_factory.mktemp("gspo-model"), hidden_size=64, num_layers=2))


def hand_gspo_loss(lps, samples, clip_low: float, clip_high: float) -> float:
    """seq-mean-token-mean of GSPO-token's per-token loss, from plain Python floats."""
    per_seq = []
    for lp, s in zip(lps, samples):
        idx = [t for t, m in enumerate(s.loss_mask) if m]
        ratio = math.exp(sum(lp[t] - s.behaviour_logprobs[t] for t in idx) / len(idx))
        clipped = min(max(ratio, 1 - clip_low), 1 + clip_high)
        per_seq.append(sum(max(-s.advantages[t] * ratio, -s.advantages[t] * clipped) for t in idx) / len(idx))
    return sum(per_seq) / len(per_seq)


def test_gspo_gets_each_tokens_sequence_and_matches_the_hand_loss(model_dir):
    samples = make_samples(6, seed=3, adv=[1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    # behaviour logprobs near the model's so some sequences land inside the clip range, some outside
    for i, s in enumerate(samples):
        s.behaviour_logprobs = [(-6.9 + 0.05 * i) * m for m in s.loss_mask]
    cfg = TrainerConfig(
        policy_loss="gspo",
        loss_agg="seq-mean-token-mean",
        clip_low=0.02,
        clip_high=0.03,
        lr=1e-3,
        micro_batch_tokens=48,
    )  # several micro-batches, several sequences in each
    with Trainer(model_dir, cfg) as t:
        lps = t.logprobs(samples)
        m = t.train_step(samples)
    want = hand_gspo_loss(lps, samples, 0.02, 0.03)
    assert m["micro_batches"] > 1 and m["micro_batches"] < len(samples)
    assert m["loss"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert 0.0 < m["clipfrac"] < 1.0  # both branches exercised, so the per-sequence ratio mattered
