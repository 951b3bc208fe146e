"""The rollout correction inside the trainer's loss: the ratio masks (trainer.rollout_correction) weight the
policy loss token by token or sequence by sequence, over several micro-batches, and report the masked
fraction; bad settings are named."""

from __future__ import annotations

import math

import pytest
from trainer_helpers import make_samples

from agentrl.errors import ConfigError
from agentrl.trainer import Trainer, TrainerConfig

ADV = [1.0, -1.0, 0.5, -0.5, 2.0, -2.0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return str(build_model(tmp_path_factory.mktemp("rc-model"), hidden_size=64, num_layers=2))


def _cfg(**kw) -> TrainerConfig:
    # old_logprobs=current: pi_old is the policy at the start of the step, so the PPO ratio is 1 and
    # the per-token policy loss is -A * w, w the correction's weight; token-mean over the loss tokens
    return TrainerConfig(lr=1e-3, micro_batch_tokens=48, old_logprobs="current", loss_agg="token-mean", **kw)


def _run(model_dir, cfg, rho):
    """Train one step on samples whose behaviour logprobs make pi_old / pi_engine = rho(i, k) for the
    k-th action token of sample i; the step's metrics, the samples."""
    samples = make_samples(6, seed=5, adv=ADV)
    with Trainer(model_dir, cfg) as t:
        lps = t.logprobs(samples)
        for i, (s, lp) in enumerate(zip(samples, lps)):
            k = iter(range(len(s.loss_mask)))
            s.behaviour_logprobs = [lp[j] - math.log(rho(i, next(k))) if m else 0.0 for j, m in enumerate(s.loss_mask)]
        m = t.train_step(samples)
    return m, samples


def _hand(samples, weight):
    """token-mean of -A * weight(i, k) over the action tokens, and the share with weight 0."""
    terms, zero = [], 0
    for i, s in enumerate(samples):
        acts = [j for j, m in enumerate(s.loss_mask) if m]
        for k, j in enumerate(acts):
            w = weight(i, k)
            terms.append(-s.advantages[j] * w)
            zero += w == 0
    return sum(terms) / len(terms), zero / len(terms)


CYCLE = [0.3, 0.8, 1.0, 2.0, 6.0]  # far from the bounds: the recomputed logprobs may differ by ~1e-6


def test_icepop_weights_and_masks_tokens_in_the_loss(model_dir):
    m, samples = _run(model_dir, _cfg(rollout_correction="icepop"), lambda i, k: CYCLE[(i + k) % 5])
    # band [0.5, 5]: weight rho for 0.8, 1, 2; 0 for 0.3 and 6
    want, frac = _hand(samples, lambda i, k: {0.3: 0.0, 6.0: 0.0}.get(CYCLE[(i + k) % 5], CYCLE[(i + k) % 5]))
    assert m["micro_batches"] > 1
    assert m["pg_loss"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert m["rollout_masked_frac"] == pytest.approx(frac, abs=1e-9)
    assert 0.3 < frac < 0.5


def test_mis_masks_only_above_its_cap_by_default(model_dir):
    m, samples = _run(model_dir, _cfg(rollout_correction="mis"), lambda i, k: CYCLE[(i + k) % 5])
    # no lower bound, cap 3: 0.3 keeps weight 0.3, 6 is masked
    want, frac = _hand(samples, lambda i, k: 0.0 if CYCLE[(i + k) % 5] == 6.0 else CYCLE[(i + k) % 5])
    assert m["pg_loss"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert m["rollout_masked_frac"] == pytest.approx(frac, abs=1e-9)


def test_seq_reject_drops_whole_episodes_across_micro_batches(model_dir):
    # every action token of episode i has the ratio SEQ[i]: episodes 2 (1.02) and 3 (0.98) leave [0.99, 1.01]
    seq_rho = [1.0, 1.005, 1.02, 0.98, 0.995, 1.0]
    m, samples = _run(model_dir, _cfg(rollout_correction="seq_reject"), lambda i, k: seq_rho[i])
    want, frac = _hand(samples, lambda i, k: 0.0 if i in (2, 3) else 1.0)
    assert m["micro_batches"] > 1
    assert m["pg_loss"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert m["rollout_masked_frac"] == pytest.approx(frac, abs=1e-9)
    # a wider band keeps them all
    m, samples = _run(
        model_dir,
        _cfg(rollout_correction="seq_reject", rollout_correction_low=0.9, rollout_correction_high=1.1),
        lambda i, k: seq_rho[i],
    )
    assert m["rollout_masked_frac"] == 0.0
    assert m["pg_loss"] == pytest.approx(_hand(samples, lambda i, k: 1.0)[0], rel=1e-5, abs=1e-6)


def test_tis_default_reports_no_mask(model_dir):
    m, _ = _run(model_dir, _cfg(), lambda i, k: CYCLE[(i + k) % 5])
    assert "rollout_masked_frac" not in m and "tis_weight" not in m  # the default: no correction at all
    m, _ = _run(model_dir, _cfg(tis_cap=2.0), lambda i, k: CYCLE[(i + k) % 5])
    assert "rollout_masked_frac" not in m and 0 < m["tis_weight"] <= 2.0


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"rollout_correction": "icepop", "tis_cap": 2.0}, "trainer.tis_cap: 2.0 applies only with rollout_correction"),
        ({"rollout_correction_low": 0.5}, "trainer.rollout_correction_low: 0.5 is a bound of the icepop"),
        ({"rollout_correction": "none", "rollout_correction_high": 2.0}, "but rollout_correction is 'none'"),
        ({"rollout_correction": "mis", "rollout_correction_high": 0.9}, "rollout_correction_high: 0.9 leaves ratio 1"),
        ({"rollout_correction": "icepop", "rollout_correction_low": 1.2}, "rollout_correction_low: 1.2 leaves ratio 1"),
    ],
)
def test_bad_settings_are_named(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        TrainerConfig(**kw).check()
