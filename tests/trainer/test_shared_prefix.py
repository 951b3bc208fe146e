"""Shared prompt prefixes in training: a GRPO group's prompt is computed once (``trainer.share_prefix_tokens``).

The layout (units, branch positions, where each branch's first token is predicted from) is checked by
hand, and the update is checked against the same samples trained whole: equal loss, metrics and weights.
"""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.trainer import Trainer, TrainerConfig, TrainSample, pack
from agentrl.trainer.attention import segment_bounds
from tests.trainer_helpers import max_diff


def group(prompt: list[int], n: int, seed: int, *, adv: float = 1.0) -> list[TrainSample]:
    """``n`` multi-turn samples after one ``prompt``: reply (1), tool output (0), reply (1)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r1, o, r2 = rng.randint(2, 9), rng.randint(1, 5), rng.randint(2, 9)
        mask = [0] * len(prompt) + [1] * r1 + [0] * o + [1] * r2
        ids = prompt + [rng.randrange(5, 1000) for _ in range(r1 + o + r2)]
        a = adv * (1 if i % 2 else -1)
        out.append(
            TrainSample(ids, mask, [-5.0 * m for m in mask], [a * m for m in mask], returns=[0.5 * m for m in mask])
        )
    return out


def prompts(k: int, length: int = 40, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(5, 1000) for _ in range(length // 2)]  # every prompt starts alike
    return [system + [rng.randrange(5, 1000) for _ in range(length - len(system))] for _ in range(k)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return str(build_model(tmp_path_factory.mktemp("share-model"), hidden_size=64, num_layers=2))


# -- layout ------------------------------------------------------------------------------------
def test_a_group_is_one_unit_with_its_prompt_once():
    a, b = prompts(2)
    samples = group(a, 4, 1) + group(b, 3, 2)
    mbs = pack(samples, max_tokens=512, share_min=32)
    (mb,) = mbs
    # Each group's prompt (40 tokens) once; not the 20-token system part all seven share (joining would cost more).
    assert mb.num_tokens == sum(len(s.token_ids) for s in samples) - 40 * (3 + 2)
    bounds = segment_bounds(mb.position_ids)
    roots = {r for _, _, r in bounds}
    assert len(roots) == 2 and len(bounds) == 7
    row = mb.input_ids[0]
    for i, s in enumerate(samples):
        at = (mb.seq_index[0] == i).nonzero().flatten()
        start, end, root = next(b for b in bounds if b[0] == int(at[0]))
        assert end - start == len(at)
        prefix = row[root : root + int(mb.position_ids[0, start])].tolist()
        assert prefix + row[at].tolist() == s.token_ids  # the sample, rebuilt from its root
        assert mb.loss_mask[0, at].tolist() == s.loss_mask[len(prefix) :]
        if start != root:  # a branch's first token is predicted from its prompt's last token
            assert int(mb.prev_index[0, start]) == root + 39
            assert int(mb.position_ids[0, start]) == 40
        assert mb.prev_index[0, start + 1 : end].tolist() == list(range(start, end - 1))


def test_the_shared_part_stops_before_the_first_trained_token():
    (p,) = prompts(1)
    samples = group(p, 2, 3)
    samples[1].loss_mask[35] = 1  # a trained token inside the prompt: only 35 tokens may be shared
    samples[1].behaviour_logprobs[35] = -5.0
    (mb,) = pack(samples, max_tokens=512, share_min=32)
    branch = [b for b in segment_bounds(mb.position_ids) if b[0] != b[2]]
    assert [int(mb.position_ids[0, s]) for s, _, _ in branch] == [35]


def test_no_sharing_below_share_min_or_across_a_full_unit():
    (p,) = prompts(1)
    samples = group(p, 4, 4)
    whole = sum(len(s.token_ids) for s in samples)
    assert pack(samples, max_tokens=512, share_min=41)[0].num_tokens == whole  # 40 shared < 41
    assert pack(samples, max_tokens=512, share_min=0)[0].prev_index is None
    # Room for the prompt plus a reply or two per micro-batch: several units, each with its prompt.
    assert sum(len(s.token_ids) for s in samples) - 3 * 40 > 70
    small = pack(samples, max_tokens=70, share_min=32)
    assert len(small) >= 2
    assert all(mb.input_ids.shape[1] <= 70 for mb in small)
    assert sum(mb.num_tokens for mb in small) == whole - 40 * (4 - len(small))


# -- the update is the same --------------------------------------------------------------------
@pytest.mark.parametrize("opts", [{}, {"kl_coef": 0.1, "entropy_coef": 0.01, "micro_batch_tokens": 120}])
def test_training_with_shared_prefixes_matches_training_each_whole(model_dir, opts):
    samples = [s for k, p in enumerate(prompts(3)) for s in group(p, 4, 10 + k, adv=0.5 + k)]
    runs = {}
    for share in (0, 32):
        cfg = TrainerConfig(lr=1e-3, share_prefix_tokens=share, seed=3, **{"micro_batch_tokens": 512, **opts})
        with Trainer(model_dir, cfg, critic=True) as t:
            m = t.train_step(samples)
            runs[share] = (m, t.full_state_dict(), t.logprobs(samples))
    (m0, sd0, lp0), (m1, sd1, lp1) = runs[0], runs[32]
    assert m1["computed_tokens"] < m0["computed_tokens"] == m0["tokens"] == m1["tokens"]
    for key in ("loss", "pg_loss", "entropy", "value_loss", "grad_norm", "critic_grad_norm"):
        assert m1[key] == pytest.approx(m0[key], rel=1e-4, abs=1e-6), key
    if "kl_coef" in opts:
        assert m1["kl"] == pytest.approx(m0["kl"], rel=1e-4, abs=1e-7)
    assert max_diff(sd0, sd1) < 1e-5
    assert max(abs(a - b) for x, y in zip(lp0, lp1) for a, b in zip(x, y)) < 1e-4


def test_other_attention_implementations_train_each_sequence_whole(model_dir):
    samples = [s for p in prompts(1) for s in group(p, 3, 5)]
    with Trainer(model_dir, TrainerConfig(attn_implementation="sdpa", micro_batch_tokens=512)) as t:
        m = t.train_step(samples)
    assert m["computed_tokens"] == m["tokens"]
    assert torch.isfinite(torch.tensor(m["loss"]))
